"""The node's lean-run registry: an episode's teardown stops its lean run, a
late lean run of a closed episode is refused, and a retry replaces an earlier
attempt still running on the node. The sandboxes are the shared in-memory
`FakeRuntime` (sandbox/fake.py) whose steps hang until released; this checks
the bookkeeping; tests/integration/episodes proves it on the real stack."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.node import NodeActivities
from contract.models import (
    EpisodeSpec,
    NodeCapacity,
    ProvisionInput,
    RunScriptedInput,
    Step,
    TeardownInput,
)
from sandbox.fake import FakeCall, FakeRuntime
from sandbox.models import ExecResult


class Hanging:
    """Every step runs until `release` is set (or its sandbox is destroyed)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = 0
        self.killed = 0

    async def __call__(self, call: FakeCall) -> ExecResult:
        self.started += 1
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.killed += 1
            raise
        return ExecResult(exit_code=0, stdout="done\n", stderr="", duration_s=0.0)


def _node(runtime: FakeRuntime, state_dir: Path) -> NodeActivities:
    capacity = NodeCapacity(cores=2, memory_mb=1 << 30, pids=1 << 30, max_sandboxes=10)
    return NodeActivities("node-1", runtime, state_dir, capacity=capacity)


def _env(run_id: str) -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, workflow_run_id=run_id)
    return env


def _lean(sandbox_id: str) -> RunScriptedInput:
    return RunScriptedInput(
        provision=ProvisionInput(
            sandbox_id=sandbox_id, spec=EpisodeSpec(image="busybox"), labels={}
        ),
        steps=[Step(cmd="hang")],
        default_timeout_s=3600,
        output_limit_bytes=1024,
    )


LEAN = _lean("sb-1")


async def _until(predicate: Any) -> None:
    while not predicate():
        await asyncio.sleep(0.01)


async def test_teardown_stops_the_runs_lean_activity_first(tmp_path: Path) -> None:
    hanging = Hanging()
    runtime = FakeRuntime(on_exec=hanging)
    node = _node(runtime, tmp_path)
    run = asyncio.create_task(_env("run-1").run(node.run_scripted, LEAN))
    await _until(lambda: hanging.started == 1)

    await _env("run-1").run(node.teardown, TeardownInput(sandbox_id="sb-1", run_id="run-1"))

    with pytest.raises(ApplicationError) as caught:
        await run
    assert caught.value.type == "EpisodeClosed" and caught.value.non_retryable
    assert runtime.sandboxes == {}
    await _until(lambda: hanging.killed == 1)  # its step died with its sandbox


async def test_a_lean_run_arriving_after_its_teardown_is_refused(tmp_path: Path) -> None:
    hanging = Hanging()
    runtime = FakeRuntime(on_exec=hanging)
    node = _node(runtime, tmp_path)
    await _env("run-2").run(node.teardown, TeardownInput(sandbox_id="sb-1", run_id="run-2"))

    with pytest.raises(ApplicationError, match="episode closed before its lean run started"):
        await _env("run-2").run(node.run_scripted, LEAN)
    assert hanging.started == 0 and runtime.sandboxes == {}


async def test_a_retry_replaces_the_attempt_still_running(tmp_path: Path) -> None:
    hanging = Hanging()
    runtime = FakeRuntime(on_exec=hanging)
    node = _node(runtime, tmp_path)
    first = asyncio.create_task(_env("run-3").run(node.run_scripted, LEAN))
    await _until(lambda: hanging.started == 1)
    second = asyncio.create_task(_env("run-3").run(node.run_scripted, LEAN))

    with pytest.raises(ApplicationError, match="lean run stopped: its episode closed"):
        await first
    other = asyncio.create_task(_env("run-4").run(node.run_scripted, _lean("sb-2")))
    await _until(lambda: hanging.started == 2)
    assert not second.done()  # another episode's run left it alone
    hanging.release.set()

    retried, _ = await asyncio.gather(second, other)
    # The retry reattached to the step the first attempt started: it ran once.
    assert [step.stdout for step in retried.steps] == ["done\n"]
    assert hanging.started == 2 and hanging.killed == 0
    await node.drain()
    assert runtime.sandboxes == {}  # both torn down after their results
