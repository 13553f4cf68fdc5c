"""Tool calls through the agent: the node's activities (activities/toolcalls.py),
and the SDK end to end when the stack itself runs with the agent on.

The activities run here outside a Temporal worker, against this package's own
agent sandboxes. The SDK test needs the stack's node workers to make sandboxes
with the agent: their default (it skips only under ``CORRAL_EXEC_AGENT=0``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from activities.toolcalls import (
    JobInput,
    JobRequest,
    SpawnInput,
    SpawnRequest,
    ToolCallActivities,
    ToolExecInput,
    ToolExecRequest,
)
from contract.config import StackConfig
from corral.sdk import Corral
from sandbox.client import Containerd
from sandbox.sandbox import Sandbox
from tests.integration.conftest import require_stack_agent

MakeSandbox = Callable[..., Awaitable[Sandbox]]  # the make_agent_sandbox fixture


def exec_input(sandbox: Sandbox, index: int, cmd: str) -> ToolExecInput:
    return ToolExecInput(
        sandbox_id=sandbox.id,
        index=index,
        request=ToolExecRequest(cmd=cmd, session="main"),
        default_timeout_s=60,
        output_limit_bytes=1 << 20,
    )


async def test_session_calls_are_journaled_and_never_run_twice(
    make_agent_sandbox: MakeSandbox, agent_ctd: Containerd, tmp_path: Path
) -> None:
    sandbox = await make_agent_sandbox()
    tools = ToolCallActivities("test", agent_ctd, tmp_path)
    first = await tools.tool_exec(
        exec_input(sandbox, 0, "cd /tmp && export N=1 && echo ran >> /tmp/log")
    )
    assert first.exit_code == 0
    second = await tools.tool_exec(exec_input(sandbox, 1, 'echo "$PWD $N"'))
    assert second.stdout == "/tmp 1\n"
    # A retried call is answered from the journal: the command ran once.
    again = await tools.tool_exec(
        exec_input(sandbox, 0, "cd /tmp && export N=1 && echo ran >> /tmp/log")
    )
    assert again == first
    assert (await sandbox.exec("cat /tmp/log")).stdout == "ran\n"
    # A call whose worker died after it started is interrupted, not rerun.
    (tmp_path / "toolcalls" / sandbox.id / "2.started").write_text("x")
    lost = await tools.tool_exec(exec_input(sandbox, 2, "echo ran >> /tmp/log"))
    assert lost.interrupted and (await sandbox.exec("cat /tmp/log")).stdout == "ran\n"


async def test_job_activities(
    make_agent_sandbox: MakeSandbox, agent_ctd: Containerd, tmp_path: Path
) -> None:
    sandbox = await make_agent_sandbox()
    tools = ToolCallActivities("test", agent_ctd, tmp_path)
    spawn = SpawnInput(
        sandbox_id=sandbox.id, index=0, request=SpawnRequest(cmd="echo up; exec sleep 300")
    )
    info = await tools.job_spawn(spawn)
    assert await tools.job_spawn(spawn) == info  # journaled: one job
    job = JobRequest(job=info.job, timeout_s=0.1)
    assert (await tools.job_wait(JobInput(sandbox_id=sandbox.id, request=job))).running
    await tools.job_kill(JobInput(sandbox_id=sandbox.id, request=job))
    done = await tools.job_wait(
        JobInput(sandbox_id=sandbox.id, request=JobRequest(job=info.job, timeout_s=30))
    )
    assert not done.running and done.signal == 9
    out = await tools.job_output(JobInput(sandbox_id=sandbox.id, request=JobRequest(job=info.job)))
    assert out.data_b64 == "dXAK" and not out.running  # "up\n"


async def test_sdk_sessions_and_jobs(corral: Corral, stack_config: StackConfig) -> None:
    require_stack_agent(stack_config)
    spec = {"image": "busybox", "interactive": True}
    async with await corral.start_episode(spec) as episode:
        await episode.exec("mkdir -p /tmp/w && cd /tmp/w && export K=v", session="main")
        second = await episode.exec('echo "$PWD $K"', session="main")
        assert second.stdout == "/tmp/w v\n"
        assert second.sensor  # the node's watermark answered for it, as for a step
        job = await episode.spawn("echo started; exec sleep 300")
        assert (await job.wait(timeout_s=0.5)).running
        await job.kill()
        state = await job.wait(timeout_s=30)
        assert not state.running and state.signal == 9
        assert await job.output() == b"started\n"
        plain = await episode.exec("echo plain")  # the step path, through the agent too
        assert plain.stdout == "plain\n"
