"""kill -9 of a worker mid-step: the episode goes on in the same sandbox, and no
completed step is lost or run twice (each step appends a line to a file, which
is read back at the end).

Each crash is tried on both ways a call runs: through the exec agent (the
default, docs/agent.md), where a call cut off by its worker is `interrupted`,
never run again, and the new worker attaches to the same agent (sessions go
on); and through runc exec (`exec_agent: false` in the spec), whose durable
exec outlives its worker and is reattached with its real exit code, and which
is `interrupted` when containerd dies under it (a call through the agent does
not need containerd).

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

from activities.step_exec import StepJournal
from contract.config import StackConfig
from contract.models import StepResult
from corral.sdk import Corral, Episode
from tests.integration.conftest import require_stack_agent
from workers.processes import wait_exit
from workers.stack import Stack

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


def _step_started(journal: Path, index: int) -> bool:
    """The node journaled the step's start (activities/step_exec.py: StepJournal)."""
    try:
        lines = (journal / StepJournal.NAME).read_bytes().splitlines()
    except FileNotFoundError:
        return False
    return any(line.startswith(f"S {index} ".encode()) for line in lines)


async def _long_step_in_flight(
    corral: Corral,
    stack_config: StackConfig,
    command: str,
    *,
    exec_agent: bool | None = None,
    session: str | None = None,
) -> tuple[Episode, str, asyncio.Task[StepResult]]:
    """An interactive episode on NODE whose step 1 (`command`) runs on the node now;
    with `session`, that shell session was given a working directory and a variable
    first (a session exec is a step too: `command` is then step 2)."""
    spec: dict[str, object] = {"image": "busybox", "interactive": True, "reward": "cat /tmp/log"}
    if exec_agent is not None:
        spec["exec_agent"] = exec_agent
    episode = await corral.start_episode(spec, node=NODE)
    if session is not None:
        assert (await episode.exec("cd /tmp && export MARK=kept", session=session)).ok
    assert (await episode.exec("echo a >> /tmp/log")).ok
    sandbox_id = (await episode.status()).sandbox_id
    long_step = asyncio.create_task(episode.exec(command))
    index = 1 if session is None else 2
    journal = _journal(stack_config, sandbox_id)
    started = f"step {index} started on the node"
    await eventually(lambda: _step_started(journal, index), what=started)
    return episode, sandbox_id, long_step


async def _read_log(episode: Episode) -> bytes:
    return await episode.read_file("/tmp/log")


async def _log_is(episode: Episode, lines: bytes) -> bool:
    return await _read_log(episode) == lines


async def test_node_worker_killed_mid_call_through_the_agent(
    corral: Corral, stack: Stack, stack_config: StackConfig
) -> None:
    require_stack_agent(stack_config)
    episode, sandbox_id, long_step = await _long_step_in_flight(
        corral, stack_config, "sleep 5; echo b >> /tmp/log; exit 3", session="main"
    )
    await _kill_and_restart(stack, f"node-worker-{NODE}")

    # The call's result went with the dead worker: the step says so and is not
    # run again; its command still ran, once, to its end.
    step = await long_step
    assert step.index == 2 and "lost with its worker" in step.interrupted, step
    await eventually(lambda: _log_is(episode, b"a\nb\n"), what="the cut-off call's line, once")
    # The new worker attached to the same agent: the shell session goes on.
    again = await episode.exec("pwd; echo $MARK", session="main")
    assert (again.exit_code, again.stdout) == (0, "/tmp\nkept\n"), again

    assert (await episode.exec("echo c >> /tmp/log")).ok
    assert (await episode.status()).sandbox_id == sandbox_id
    final = await episode.finish()
    assert final.outcome == "completed"
    assert final.reward is not None and final.reward.stdout == "a\nb\nc\n"
    assert not await sandbox_exists(stack_config, sandbox_id)


async def test_node_worker_killed_mid_runc_exec(
    corral: Corral, stack: Stack, stack_config: StackConfig
) -> None:
    episode, sandbox_id, long_step = await _long_step_in_flight(
        corral,
        stack_config,
        "sleep 5; echo b >> /tmp/log; echo out; echo err >&2; exit 3",
        exec_agent=False,
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
    assert await _read_log(episode) == b"a\nb\nc\n"
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
        return _step_started(marker_dir, 1)

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


async def _kill_containerd_during(stack: Stack, step: asyncio.Task[StepResult]) -> StepResult:
    """kill -9 node-1's containerd while `step` runs; its result, containerd back."""
    daemon = stack.daemon(NODE)
    pid = daemon.pid
    assert pid is not None, "containerd of node-1 is not running"
    os.kill(pid, signal.SIGKILL)
    try:
        assert wait_exit(pid, 10), "containerd survived SIGKILL"
        return await step
    finally:
        await daemon.start()  # the shims kept the sandbox; the new daemon adopts it


async def test_containerd_killed_mid_call_through_the_agent(
    corral: Corral, stack: Stack, stack_config: StackConfig
) -> None:
    require_stack_agent(stack_config)
    episode, sandbox_id, long_step = await _long_step_in_flight(
        corral, stack_config, "sleep 5; echo b >> /tmp/log"
    )
    # A call through the agent needs no containerd: it finishes as if nothing happened.
    step = await _kill_containerd_during(stack, long_step)
    assert (step.index, step.exit_code, step.interrupted) == (1, 0, ""), step
    assert await _read_log(episode) == b"a\nb\n"
    final = await episode.finish()
    assert final.outcome == "completed"
    assert not await sandbox_exists(stack_config, sandbox_id)


async def test_containerd_killed_mid_runc_exec_reports_interrupted(
    corral: Corral, stack: Stack, stack_config: StackConfig
) -> None:
    episode, sandbox_id, long_step = await _long_step_in_flight(
        corral, stack_config, "sleep 20; echo b >> /tmp/log", exec_agent=False
    )
    step = await _kill_containerd_during(stack, long_step)

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
