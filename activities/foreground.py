"""Foreground work first: background work on a node waits for a quiet moment.

A node's background work (refilling the warm pool, destroying a lean run's
sandbox after its result has gone back) costs as much CPU as the step a
trainer is waiting on: a runc create or delete is ~100-150 ms of CPU on these
machines. Started at the moment a warm sandbox is claimed, the refill ran
beside the episode's first step and doubled it (bench --peers: exec 90 ms in
warm episodes against 47 ms in cold ones). Background work therefore waits
until no step has run for `settle_s`, but never longer than `max_wait_s`, so a
node that is never quiet still refills its pool and frees its sandboxes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator

SETTLE_S = 0.05  # a step that has just ended is often followed by the next one
MAX_WAIT_S = 1.0  # background work is late by at most this much


class Foreground:
    def __init__(
        self,
        *,
        settle_s: float = SETTLE_S,
        max_wait_s: float = MAX_WAIT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settle_s = settle_s
        self._max_wait_s = max_wait_s
        self._clock = clock
        self._running = 0
        self._last_seen = float("-inf")

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Mark foreground work (a step) for the body's duration."""
        self.touch()
        self._running += 1
        try:
            yield
        finally:
            self._running -= 1
            self.touch()

    def touch(self) -> None:
        """Foreground work is about to start (a warm claim precedes its first step)."""
        self._last_seen = self._clock()

    def is_quiet(self) -> bool:
        return self._running == 0 and self._clock() - self._last_seen >= self._settle_s

    async def quiet(self) -> None:
        """Return once the node is quiet, or after `max_wait_s` regardless."""
        deadline = self._clock() + self._max_wait_s
        while not self.is_quiet():
            left = deadline - self._clock()
            if left <= 0:
                return
            await asyncio.sleep(min(self._settle_s, left))
