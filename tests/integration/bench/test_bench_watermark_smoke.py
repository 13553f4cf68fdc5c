"""`corral bench --sensor --watermark` on the session stack, at a tiny size.

A smoke test, not a benchmark: every episode's step was judged by the sensor
(`ok`), and the report's figures are consistent. No timing is asserted.
"""

from __future__ import annotations

import pytest

from corral.bench.watermark import describe, run_watermark
from workers.stack import Stack

pytestmark = pytest.mark.integration


async def test_bench_watermark_reports_each_steps_wait(stack: Stack) -> None:
    ticks: list[int] = []
    report = await run_watermark(stack.config, n=4, concurrency=2, tick=lambda: ticks.append(1))
    assert report.episodes == 4 and len(ticks) == 4
    assert report.verdicts == {"ok": 4}
    assert 0 < report.settle_p50_ms <= report.settle_p99_ms
    assert report.settle_p50_ms < report.episode_p50_ms
    assert 0 < report.settle_share_p50 < 1
    assert any("watermark wait" in line for line in describe(report))
