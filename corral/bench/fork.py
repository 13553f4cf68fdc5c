"""`corral bench --fork`: snapshot, fork and hibernate through the running stack.

Each round starts an interactive parent episode, writes `--fork-mb` MB of
random data into its sandbox, then measures
  * snapshot: the `snapshot` Update (diff of the writable layer, commit, unpack);
  * fork into 8, and into 32: `Episode.fork(n)` until all n children
    answered an exec (snapshot, n durable episodes placed and provisioned,
    one exec each), each from a parent of its own;
  * hibernate -> restore: an episode with that much data idles past
    `hibernate_after_s`; the next exec restores its sandbox from the snapshot
    first. Reported next to a plain exec in a live sandbox.
Targets (DESIGN.md, issue 23): fork into 8 p50 <= 1 s, hibernate -> restore
<= 1 s for 100 MB; fork into 32 is measured. With `--json`: `fork_8_p50_s`,
`fork_8_p90_s`, `fork_32_p50_s`, `fork_32_p90_s`. A benchmark, not a test: it
asserts nothing and ends every episode it starts.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel

from contract.config import StackConfig
from corral.sdk import Corral, Episode

GROUPS = (8, 32)  # children per fork, each measured every round
HIBERNATE_AFTER_S = 1.0
POLL_S = 0.1


class ForkReport(BaseModel):
    rounds: int
    data_mb: int
    fork_8_p50_s: float | None
    fork_8_p90_s: float | None
    fork_32_p50_s: float | None
    fork_32_p90_s: float | None
    snapshot_s: list[float]
    fork_s: dict[int, list[float]]  # children -> seconds per round
    restore_exec_s: list[float]
    live_exec_s: list[float]
    ratios: dict[str, float]
    targets: dict[str, str]


async def run_fork(
    config: StackConfig,
    *,
    rounds: int = 5,
    data_mb: int = 100,
    groups: tuple[int, ...] = GROUPS,
    tick: Callable[[], None] = lambda: None,
) -> ForkReport:
    snapshot_s: list[float] = []
    fork_s: dict[int, list[float]] = {n: [] for n in groups}
    restore_s: list[float] = []
    live_s: list[float] = []
    async with await Corral.connect(config) as corral:
        for _ in range(rounds):
            for children in groups:
                snap, forked = await _fork_round(corral, data_mb, children)
                snapshot_s.append(snap)
                fork_s[children].append(forked)
            restored, live = await _hibernate_round(corral, data_mb)
            restore_s.append(restored)
            live_s.append(live)
            tick()
    restore_p50 = statistics.median(restore_s)
    first = groups[0]
    return ForkReport(
        rounds=rounds,
        data_mb=data_mb,
        fork_8_p50_s=_quantile(fork_s.get(8), 0.5),
        fork_8_p90_s=_quantile(fork_s.get(8), 0.9),
        fork_32_p50_s=_quantile(fork_s.get(32), 0.5),
        fork_32_p90_s=_quantile(fork_s.get(32), 0.9),
        snapshot_s=snapshot_s,
        fork_s=fork_s,
        restore_exec_s=restore_s,
        live_exec_s=live_s,
        ratios={
            f"fork into {first} p50 / 1 s": round(statistics.median(fork_s[first]), 3),
            "hibernate -> restore p50 / 1 s": round(restore_p50, 3),
            "restore exec / live exec (p50)": round(restore_p50 / statistics.median(live_s), 1),
            "snapshot p50 (s)": round(statistics.median(snapshot_s), 3),
        },
        targets={
            f"fork into {first} p50 / 1 s": "<= 1.0",
            "hibernate -> restore p50 / 1 s": "<= 1.0",
        },
    )


def _quantile(values: list[float] | None, q: float) -> float | None:
    """The q-quantile (nearest rank) in seconds; None when that fork size was not run."""
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)], 3)


async def _fork_round(corral: Corral, data_mb: int, children_n: int) -> tuple[float, float]:
    """(snapshot seconds, fork seconds) for a parent holding `data_mb` MB."""
    parent = await corral.start_episode(_spec(data_mb))
    children: list[Episode] = []
    try:
        await _write_data(parent, data_mb)
        snapshot_s, _ = await _timed(parent.snapshot())
        started = time.perf_counter()
        children = await parent.fork(children_n)
        await asyncio.gather(*(child.exec("true") for child in children))
        return snapshot_s, time.perf_counter() - started
    finally:
        await _end_all([*children, parent])


async def _hibernate_round(corral: Corral, data_mb: int) -> tuple[float, float]:
    """(restore + exec seconds, live exec seconds) for an episode holding `data_mb` MB."""
    spec = _spec(data_mb)
    spec["timeouts"] = {"hibernate_after_s": HIBERNATE_AFTER_S}
    episode = await corral.start_episode(spec)
    try:
        await _write_data(episode, data_mb)
        live_s, _ = await _timed(episode.exec("true"))
        while (await episode.status()).state != "hibernated":
            await asyncio.sleep(POLL_S)
        restore_s, _ = await _timed(episode.exec("true"))
        return restore_s, live_s
    finally:
        await _end_all([episode])


def _spec(data_mb: int) -> dict[str, Any]:
    # Room for the page cache of the data written (it counts against the limit).
    return {"image": "busybox", "interactive": True, "resources": {"memory_mb": 256 + data_mb}}


async def _write_data(episode: Episode, data_mb: int) -> None:
    step = await episode.exec(
        f"mkdir -p /data && dd if=/dev/urandom of=/data/blob bs=1M count={data_mb} 2>/dev/null"
    )
    if not step.ok:
        raise RuntimeError(f"writing {data_mb} MB failed: {step.stderr.strip()}")


async def _timed(work: Awaitable[Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    value = await work
    return time.perf_counter() - started, value


async def _end_all(episodes: list[Episode]) -> None:
    """Finish every episode (tearing its sandbox down), whatever state it is in."""
    await asyncio.gather(*(_end(episode) for episode in episodes), return_exceptions=True)


async def _end(episode: Episode) -> None:
    try:
        await episode.finish()
    except Exception:
        await episode.cancel()
