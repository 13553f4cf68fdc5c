"""A Corral client for synchronous framework code: its own event loop on a thread.

mini-swe-agent and skyrl-gym call their environments synchronously; the SDK is
async. One `SyncCorral` per process serves every environment of that process
(`shared`), so a thousand environments share one Temporal connection.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from contract.config import StackConfig
from corral.sdk import Corral

T = TypeVar("T")

# Keyed by identity; the config is kept alongside so its id is never reused.
_shared: dict[int, tuple[StackConfig | None, SyncCorral]] = {}
_shared_lock = threading.Lock()


class SyncCorral:
    """`Corral` behind a private event loop; `run` waits for one coroutine on it."""

    def __init__(self, config: StackConfig | None = None) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="corral-sync", daemon=True
        )
        self._thread.start()
        try:
            self.corral: Corral = self.run(Corral.connect(config))
        except BaseException:
            self.close()
            raise

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self._thread:
            raise RuntimeError("SyncCorral.run called from its own loop: await the SDK instead")
        return asyncio.run_coroutine_threadsafe(work, self._loop).result()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


def shared(config: StackConfig | None = None) -> SyncCorral:
    """The process's `SyncCorral` for `config` (the stack's own config when None)."""
    key = id(config)
    with _shared_lock:
        if key not in _shared:
            _shared[key] = (config, SyncCorral(config))
        return _shared[key][1]
