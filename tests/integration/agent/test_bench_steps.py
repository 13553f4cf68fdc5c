"""`corral bench --steps` on the test stack, small: its JSON has every side's figures.

A smoke test of the bench's plumbing (sides, keys, cleanup), not of its figures:
nothing here compares a rate or a latency with a threshold.
"""

from __future__ import annotations

import json

from corral.bench_steps import NAMESPACE, run_steps
from sandbox.client import Containerd
from workers.config import StackConfig
from workers.stack import Stack

SANDBOXES, CALLS = 2, 3
FIGURES = ("steps_per_s", "step_p50_ms", "step_p90_ms", "cpu_ms_per_step")


def check_side(side: dict[str, object]) -> None:
    assert side["calls"] == SANDBOXES * CALLS
    assert side["failures"] == 0, side
    for key in FIGURES:
        value = side[key]
        assert isinstance(value, float) and value > 0, (key, side)
    assert side["step_p50_ms"] <= side["step_p90_ms"]  # type: ignore[operator]


async def test_bench_steps_reports_every_side(stack: Stack) -> None:
    report = await run_steps(stack.config, sandboxes=SANDBOXES, calls=CALLS, single_calls=2)
    data = json.loads(report.model_dump_json())
    for name in ("corral", "ctr", "sandbox_agent", "sandbox_runc"):
        check_side(data[name])
    corral = data["corral"]
    assert corral["temporal_cpu_ms_per_step"] > 0
    # Each call is at least an Update and an activity in the episode's history.
    assert corral["history_events_per_step"] >= 2
    assert "corral / ctr steps_per_s" in data["ratios"]
    docker = data["docker"]
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
