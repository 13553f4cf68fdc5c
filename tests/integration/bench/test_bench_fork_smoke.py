"""`corral bench --fork` on the session stack, at a tiny size.

A smoke test, not a benchmark: each fork size runs from a parent of its own,
every child answers, the report carries the issue's keys for the sizes it ran
(and None for those it did not), and no sandbox is left. No timing is asserted.
"""

from __future__ import annotations

import pytest

from corral.bench.fork import run_fork
from tests.integration.conftest import sandboxes_left, wait_for
from workers.stack import Stack

pytestmark = pytest.mark.integration


async def test_bench_fork_measures_each_fork_size_and_leaves_nothing(stack: Stack) -> None:
    ticks: list[int] = []
    report = await run_fork(
        stack.config, rounds=1, data_mb=1, groups=(2, 3), tick=lambda: ticks.append(1)
    )
    assert ticks == [1]
    assert sorted(report.fork_s) == [2, 3]
    assert all(len(seconds) == 1 and seconds[0] > 0 for seconds in report.fork_s.values())
    assert len(report.snapshot_s) == 2  # one parent per fork size
    assert len(report.restore_exec_s) == len(report.live_exec_s) == 1
    # Sizes the run left out are None in the JSON, not a number.
    assert report.fork_8_p50_s is report.fork_32_p90_s is None
    assert "fork into 2 p50 / 1 s" in report.ratios

    async def nothing_left() -> bool:
        return not await sandboxes_left(stack.config)

    await wait_for(nothing_left, timeout_s=60)
