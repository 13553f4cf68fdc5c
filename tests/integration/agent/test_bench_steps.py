"""`corral bench --steps` on the test stack, small: its JSON has every side's figures.

A smoke test of the bench's plumbing (sides, keys, cleanup), not of its figures:
nothing here compares a rate or a latency with a threshold.
"""

from __future__ import annotations

import json
import shutil

from contract.config import StackConfig
from corral.bench.steps import NAMESPACE, run_steps
from sandbox.client import Containerd
from workers.stack import Stack

SANDBOXES, CALLS = 2, 3
FIGURES = ("steps_per_s", "step_p50_ms", "step_p90_ms")


def check_side(side: dict[str, object], *, loses_output: bool = False) -> None:
    """`loses_output`: a peer known to drop a fast exec's output now and then (ctr's
    FIFO race, docs/benchmarks.md); counted as failures, so not all must succeed."""
    assert side["calls"] == SANDBOXES * CALLS
    failures = side["failures"]
    assert isinstance(failures, int)
    assert failures < SANDBOXES * CALLS if loses_output else failures == 0, side
    for key in FIGURES:
        value = side[key]
        assert isinstance(value, float) and value > 0, (key, side)
    assert side["step_p50_ms"] <= side["step_p90_ms"]  # type: ignore[operator]
    # Busy time is counted in clock ticks: a few fast calls may fall within one.
    assert isinstance(side["cpu_ms_per_step"], float) and side["cpu_ms_per_step"] >= 0


async def test_bench_steps_reports_every_side(stack: Stack) -> None:
    report = await run_steps(stack.config, sandboxes=SANDBOXES, calls=CALLS, single_calls=2)
    data = json.loads(report.model_dump_json())
    for name in ("corral", "sandbox_runc"):
        check_side(data[name])
    agent = data["sandbox_agent"]
    if agent["available"]:
        check_side(agent)
    else:  # the agent is not built here: said so (the other agent tests skip too)
        assert "setup.sh" in agent["skipped_because"]
    check_side(data["ctr"], loses_output=True)
    corral = data["corral"]
    assert corral["temporal_cpu_ms_per_step"] > 0
    # Each call is at least an Update and an activity in the episode's history.
    assert corral["history_events_per_step"] >= 2
    assert "corral / ctr steps_per_s" in data["ratios"]
    docker = data["docker"]
    # setup.sh installs docker.io and the bench starts its own dockerd.
    assert docker["available"] or shutil.which("dockerd") is None, docker["skipped_because"]
    if docker["available"]:
        check_side(docker)
        assert "corral / docker steps_per_s" in data["ratios"]
    else:  # no docker engine on this machine: said so, and no ratio made up
        assert docker["skipped_because"]
        assert "corral / docker steps_per_s" not in data["ratios"]
    await _no_sandbox_left(stack.config)


async def _no_sandbox_left(config: StackConfig) -> None:
    socket = str(config.containerd_socket(config.node_names()[0]))
    async with await Containerd.connect(socket, namespace=NAMESPACE) as client:
        assert await client.container_ids() == []
        assert await client.task_ids() == []
