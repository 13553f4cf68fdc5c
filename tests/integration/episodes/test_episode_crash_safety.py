"""kill -9 of a worker mid-step: the episode goes on in the same sandbox, and no
completed step is lost or run twice (each step appends a line to a file, which
is read back at the end).

These tests kill and restart the session stack's own worker processes, by the
pid files the stack keeps; they pin their episodes to node-1.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
from episode_helpers import eventually, sandbox_exists

from corral.sdk import Corral, Episode
from workers.config import StackConfig
from workers.processes import wait_exit
from workers.stack import Stack
from workflows.models import StepResult

pytestmark = pytest.mark.integration

NODE = "node-1"


async def _kill_and_restart(stack: Stack, name: str) -> None:
    proc = stack.process(name)
    pid = proc.pid()
    assert pid is not None, f"{name} is not running"
    os.kill(pid, signal.SIGKILL)
    assert wait_exit(pid, 10), f"{name} survived SIGKILL"
    # Each start helper starts only what is not running.
    if name == "workflow-worker":
        stack._start_control()
        await stack._wait_for_workers([], control=True)
    else:
        stack._start_node_processes(NODE)
        await stack._wait_for_workers([NODE], control=False)
    assert proc.pid() not in (None, pid)


def _journal(stack_config: StackConfig, sandbox_id: str) -> Path:
    return stack_config.node_dir(NODE) / "journal" / sandbox_id


async def _long_step_in_flight(
    corral: Corral, stack_config: StackConfig, command: str
) -> tuple[Episode, str, asyncio.Task[StepResult]]:
    """An interactive episode on NODE whose step 1 (`command`) runs on the node now."""
    episode = await corral.start_episode(
        {"image": "busybox", "interactive": True, "reward": "cat /tmp/log"}, node=NODE
    )
    assert (await episode.exec("echo a >> /tmp/log")).ok
    sandbox_id = (await episode.status()).sandbox_id
    long_step = asyncio.create_task(episode.exec(command))
    marker = _journal(stack_config, sandbox_id) / "1.started"
    await eventually(marker.exists, what="step 1 started on the node")
    return episode, sandbox_id, long_step


async def test_node_worker_killed_mid_step(
    corral: Corral, stack: Stack, stack_config: StackConfig
) -> None:
    episode, sandbox_id, long_step = await _long_step_in_flight(
        corral, stack_config, "sleep 5; echo b >> /tmp/log; echo out; echo err >&2; exit 3"
    )
    await _kill_and_restart(stack, f"node-worker-{NODE}")

    # The restarted worker reattached to the step's exec (the shim outlived the
    # worker): the real exit code and output, not an "interrupted".
    step = await long_step
    assert (step.index, step.exit_code, step.interrupted) == (1, 3, "")
    assert (step.stdout, step.stderr) == ("out\n", "err\n")

    assert (await episode.exec("echo c >> /tmp/log")).ok
    assert (await episode.status()).sandbox_id == sandbox_id
    # Nothing ran twice, nothing completed was lost.
    assert await episode.read_file("/tmp/log") == b"a\nb\nc\n"
    final = await episode.finish()
    assert final.outcome == "completed"
    assert [s.index for s in final.steps] == [0, 1, 2, 3]
    assert final.reward is not None and final.reward.stdout == "a\nb\nc\n"
    assert not await sandbox_exists(stack_config, sandbox_id)


async def test_workflow_worker_killed_mid_step(
    corral: Corral, stack: Stack, stack_config: StackConfig
) -> None:
    spec = {
        "image": "busybox",
        "steps": ["echo 1 >> /tmp/log", "sleep 5; echo 2 >> /tmp/log", "echo 3 >> /tmp/log"],
        "reward": "cat /tmp/log",
    }
    episode = await corral.start_episode(spec, node=NODE)
    marker_dir = None

    async def step_1_started() -> bool:
        nonlocal marker_dir
        status = await episode.status()
        marker_dir = _journal(stack_config, status.sandbox_id)
        return (marker_dir / "1.started").exists()

    await eventually(step_1_started, what="step 1 started on the node")
    await _kill_and_restart(stack, "workflow-worker")

    result = await episode.result()
    assert result.outcome == "completed", result.reason
    assert [(s.index, s.exit_code) for s in result.steps] == [(0, 0), (1, 0), (2, 0), (3, 0)]
    assert result.reward is not None and result.reward.stdout == "1\n2\n3\n"

    async def removed() -> bool:  # a lean run's node tears down just after the result
        return not await sandbox_exists(stack_config, result.sandbox_id)

    await eventually(removed, what="sandbox removed")


async def test_workflow_worker_killed_during_an_interactive_update(
    corral: Corral, stack: Stack, stack_config: StackConfig
) -> None:
    episode, sandbox_id, long_step = await _long_step_in_flight(
        corral, stack_config, "sleep 5; echo b >> /tmp/log; echo out"
    )
    await _kill_and_restart(stack, "workflow-worker")

    step = await long_step  # the caller's Update survives the worker
    assert (step.index, step.exit_code, step.stdout) == (1, 0, "out\n")
    final = await episode.finish()
    assert final.reward is not None and final.reward.stdout == "a\nb\n"
    assert final.sandbox_id == sandbox_id
    assert not await sandbox_exists(stack_config, sandbox_id)


async def test_containerd_killed_mid_step_reports_interrupted(
    corral: Corral, stack: Stack, stack_config: StackConfig
) -> None:
    episode, sandbox_id, long_step = await _long_step_in_flight(
        corral, stack_config, "sleep 20; echo b >> /tmp/log"
    )
    daemon = stack.daemon(NODE)
    pid = daemon.pid
    assert pid is not None, "containerd of node-1 is not running"
    os.kill(pid, signal.SIGKILL)
    try:
        assert wait_exit(pid, 10), "containerd survived SIGKILL"
        step = await long_step
    finally:
        await daemon.start()  # the shims kept the sandbox; the new daemon adopts it

    # No bare exit code: the step says it was interrupted, and by what.
    assert step.index == 1 and not step.ok
    assert "containerd is unavailable" in step.interrupted, step.interrupted
    assert step.stderr == f"corral: interrupted: {step.interrupted}"

    # The episode goes on in the same sandbox once containerd is back.
    assert (await episode.exec("echo c >> /tmp/log")).ok
    assert (await episode.status()).sandbox_id == sandbox_id
    final = await episode.finish()
    assert final.outcome == "completed"
    assert final.steps[1].interrupted == step.interrupted
    assert not await sandbox_exists(stack_config, sandbox_id)
