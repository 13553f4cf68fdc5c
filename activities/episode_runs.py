"""The episode runs this node is working for, and those closed here, by workflow run id.

A kill can land while the node is still making the sandbox. So a provision
and a lean run register under their workflow run id while they last, and the
episode's teardown (which carries the run id) closes the run here: it stops
the run's lean activity and waits for it, lets a provision already under way
finish first (nothing is made after the teardown looked), and a lean run or
provision of a closed run that arrives later is refused (`EpisodeClosed`). A
retried lean run replaces an earlier attempt the server gave up on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

from activities.glue import app_error, heartbeating
from contract.models import RunScriptedResult

# A teardown waits this long for the lean run it stops to unwind.
LEAN_STOP_WAIT_S = 30.0
# Closed episode runs remembered per node (a late lean run of one is refused).
CLOSED_RUNS_KEPT = 10_000


class EpisodeRuns:
    def __init__(self) -> None:
        self._lean_runs: dict[str, asyncio.Task[RunScriptedResult]] = {}
        self._provisions: dict[str, asyncio.Task[Any]] = {}
        self._closed: OrderedDict[str, None] = OrderedDict()

    @contextlib.contextmanager
    def provisioning(self, run_id: str) -> Iterator[None]:
        """The body is this run's provision (refused if the run is closed here)."""
        if run_id in self._closed:
            raise app_error("EpisodeClosed", "episode closed before its sandbox was made")
        current = asyncio.current_task()
        if current is not None:
            self._provisions[run_id] = current
        try:
            yield
        finally:
            if self._provisions.get(run_id) is current:
                del self._provisions[run_id]

    async def run_lean(
        self, run_id: str, work: Callable[[], Coroutine[Any, Any, RunScriptedResult]]
    ) -> RunScriptedResult:
        """`work()` as this run's lean run: an earlier attempt still here is stopped
        first, a closed run is refused, and a close while it runs stops it."""
        await self.stop_lean(run_id)
        if run_id in self._closed:
            raise app_error("EpisodeClosed", "episode closed before its lean run started")
        run = asyncio.create_task(work())
        self._lean_runs[run_id] = run
        try:
            return await run
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # the activity itself was cancelled
            raise app_error("EpisodeClosed", "lean run stopped: its episode closed") from None
        finally:
            if self._lean_runs.get(run_id) is run:
                del self._lean_runs[run_id]

    async def close(self, run_id: str) -> None:
        """The episode's teardown: its lean run stopped, its provision finished first."""
        self._closed[run_id] = None
        while len(self._closed) > CLOSED_RUNS_KEPT:
            self._closed.popitem(last=False)
        await self.stop_lean(run_id)
        provision = self._provisions.get(run_id)
        if provision is not None and not provision.done():
            # Let it finish (or roll back) first: the teardown then finds what it made.
            await heartbeating(asyncio.wait({provision}, timeout=LEAN_STOP_WAIT_S))

    async def stop_lean(self, run_id: str) -> None:
        """Stop this run's lean activity, if one is in flight here, and wait for it."""
        run = self._lean_runs.get(run_id)
        if run is None or run.done():
            return
        run.cancel()
        await heartbeating(asyncio.wait({run}, timeout=LEAN_STOP_WAIT_S))
