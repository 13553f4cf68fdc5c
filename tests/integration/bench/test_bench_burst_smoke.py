"""`corral bench --burst` end to end on the session stack, at a tiny size.

A smoke test, not a benchmark: both sides run every rollout and call with
the right output, the report has its shape, and no timing is asserted.
"""

from __future__ import annotations

import shutil

import pytest

from contract.config import StackConfig
from corral.bench.burst import describe, run_burst
from workers.stack import Stack

pytestmark = pytest.mark.integration

WIDTH, CALLS = 4, 2


async def test_a_small_burst_runs_on_corral_and_on_docker(
    stack: Stack, stack_config: StackConfig
) -> None:
    report = await run_burst(stack_config, width=WIDTH, calls=CALLS, in_flight=3)
    corral = report.corral
    assert (corral.rollouts, corral.calls, corral.failures) == (WIDTH, WIDTH * CALLS, 0)
    assert 0 < corral.start_p50_ms <= corral.start_p99_ms
    assert 0 < corral.call_p50_ms <= corral.call_p99_ms
    assert report.max_waiting == 0  # by use, four idle episodes never wait for room
    if shutil.which("dockerd") is None:  # setup.sh installs docker.io; a bare machine may not
        assert report.docker is None and "docker" in report.docker_skipped_because
        return
    assert report.docker is not None, report.docker_skipped_because
    assert (report.docker.calls, report.docker.failures) == (WIDTH * CALLS, 0)
    assert set(report.ratios) == {"corral / docker wall_s", "corral / docker start_p99_ms"}
    assert any(line.startswith("docker ") for line in describe(report))
