"""`corral bench --sensor --watermark`: what the watermark costs an episode.

Every agent command waits, before its result returns, until the node's
sensor has judged its events and delivered its alerts
(`activities/sensorwatch.py`). This runs ``n`` one-step scripted episodes
(the lean path, on the warm pool when the stack has one, as users run them)
on the running stack, ``concurrency`` at a time, and reports the wait each
step spent there (``StepResult.settle_ms``, measured on the node) next to
the episode's own wall time, p50 and p99, and the share of the episode it
is. A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from pydantic import BaseModel

from contract.config import StackConfig
from corral.sdk import Corral


class WatermarkReport(BaseModel):
    episodes: int
    settle_p50_ms: float
    settle_p99_ms: float
    episode_p50_ms: float
    episode_p99_ms: float
    settle_share_p50: float  # settle p50 / episode p50
    verdicts: dict[str, int]  # StepResult.sensor -> how many steps said it


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


async def run_watermark(
    config: StackConfig,
    *,
    n: int = 100,
    concurrency: int = 4,
    tick: Callable[[], None] = lambda: None,
) -> WatermarkReport:
    settles: list[float] = []
    walls: list[float] = []
    verdicts: dict[str, int] = {}
    gate = asyncio.Semaphore(concurrency)
    async with await Corral.connect(config) as corral:

        async def one(i: int) -> None:
            async with gate:
                result = await corral.run_episode({"image": "busybox", "steps": [f"echo {i}"]})
            for step in result.steps:
                settles.append(step.settle_ms)
                verdicts[step.sensor or "-"] = verdicts.get(step.sensor or "-", 0) + 1
            walls.append(result.duration_s * 1000)
            tick()

        await asyncio.gather(*(one(i) for i in range(n)))
    settle_p50, episode_p50 = _pct(settles, 0.5), _pct(walls, 0.5)
    return WatermarkReport(
        episodes=n,
        settle_p50_ms=settle_p50,
        settle_p99_ms=_pct(settles, 0.99),
        episode_p50_ms=episode_p50,
        episode_p99_ms=_pct(walls, 0.99),
        settle_share_p50=round(settle_p50 / episode_p50, 4) if episode_p50 else 0.0,
        verdicts=verdicts,
    )


def describe(report: WatermarkReport) -> list[str]:
    return [
        f"{report.episodes} one-step episodes; steps' sensor verdicts: {report.verdicts}",
        f"watermark wait  p50 {report.settle_p50_ms:8.1f} ms  p99 {report.settle_p99_ms:8.1f} ms",
        f"episode         p50 {report.episode_p50_ms:8.1f} ms  p99 {report.episode_p99_ms:8.1f} ms",
        f"the wait is {report.settle_share_p50 * 100:.1f}% of a median episode",
    ]
