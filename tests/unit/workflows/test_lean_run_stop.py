"""The node's lean-run registry: an episode's teardown stops its lean run, a
late lean run of a closed episode is refused, and a retry replaces an earlier
attempt still running on the node. The sandbox work is stubbed: this checks
the bookkeeping; tests/integration/episodes proves it on the real stack."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any, cast

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.models import (
    EpisodeSpec,
    NodeCapacity,
    ProvisionInput,
    RunScriptedInput,
    RunScriptedResult,
    TeardownInput,
)
from activities.node import NodeActivities
from sandbox import Containerd


class StubContainerd:
    """Only what a teardown by sandbox id touches."""

    def __init__(self) -> None:
        self.destroyed: list[str] = []

    async def list_sandboxes(self, label_filter: dict[str, str] | None = None) -> list[Any]:
        return []

    async def destroy_sandbox(self, sandbox_id: str) -> bool:
        self.destroyed.append(sandbox_id)
        return True


class HangingNode(NodeActivities):
    """A node whose lean runs never finish on their own."""

    def __init__(self, state_dir: Path) -> None:
        self.stub = StubContainerd()
        super().__init__(
            "node-1",
            cast(Containerd, self.stub),
            state_dir,
            capacity=NodeCapacity(cores=2, memory_mb=4096, pids=4096, max_sandboxes=10),
        )
        self.started = 0
        self.stopped = 0

    async def _run_scripted(self, input: RunScriptedInput) -> RunScriptedResult:
        self.started += 1
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.stopped += 1
            raise
        raise AssertionError("unreachable")


def _env(run_id: str) -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, workflow_run_id=run_id)
    return env


LEAN = RunScriptedInput(
    provision=ProvisionInput(sandbox_id="sb-1", spec=EpisodeSpec(image="busybox"), labels={}),
    steps=[],
    default_timeout_s=10,
    output_limit_bytes=1024,
)


async def _until(predicate: Any) -> None:
    while not predicate():
        await asyncio.sleep(0.01)


async def test_teardown_stops_the_runs_lean_activity_first(tmp_path: Path) -> None:
    node = HangingNode(tmp_path)
    run = asyncio.create_task(_env("run-1").run(node.run_scripted, LEAN))
    await _until(lambda: node.started == 1)

    await _env("run-1").run(node.teardown, TeardownInput(sandbox_id="sb-1", run_id="run-1"))

    assert node.stopped == 1 and node.stub.destroyed == ["sb-1"]
    with pytest.raises(ApplicationError) as caught:
        await run
    assert caught.value.type == "EpisodeClosed" and caught.value.non_retryable


async def test_a_lean_run_arriving_after_its_teardown_is_refused(tmp_path: Path) -> None:
    node = HangingNode(tmp_path)
    await _env("run-2").run(node.teardown, TeardownInput(sandbox_id="sb-1", run_id="run-2"))

    with pytest.raises(ApplicationError, match="episode closed before its lean run started"):
        await _env("run-2").run(node.run_scripted, LEAN)
    assert node.started == 0


async def test_a_retry_replaces_the_attempt_still_running(tmp_path: Path) -> None:
    node = HangingNode(tmp_path)
    first = asyncio.create_task(_env("run-3").run(node.run_scripted, LEAN))
    await _until(lambda: node.started == 1)
    second = asyncio.create_task(_env("run-3").run(node.run_scripted, LEAN))
    await _until(lambda: node.started == 2)

    assert node.stopped == 1
    with pytest.raises(ApplicationError, match="lean run stopped: its episode closed"):
        await first
    other = asyncio.create_task(_env("run-4").run(node.run_scripted, LEAN))
    await _until(lambda: node.started == 3)
    assert node.stopped == 1  # another episode's run is left alone
    for task in (second, other):
        task.cancel()
    await asyncio.gather(second, other, return_exceptions=True)
