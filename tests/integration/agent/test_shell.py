"""A shell on a PTY (`Job.send`, `corral episode shell`): keys in, the terminal's output
back, the shell's exit status at the end. Waits are bounded only so that a failure
cannot hang the run; no timing is asserted."""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import cast

from test_stream import ActivityEpisode  # the activities answering Job's Updates

from activities.toolcalls import (
    JobInput,
    JobRequest,
    JobStdinInput,
    JobStdinRequest,
    SpawnInput,
    SpawnRequest,
    ToolCallActivities,
)
from contract.config import StackConfig
from corral.sdk import Corral, Episode, Job
from sandbox.client import Containerd
from sandbox.sandbox import Sandbox
from tests.integration.conftest import require_stack_agent

MakeSandbox = Callable[..., Awaitable[Sandbox]]  # the make_agent_sandbox fixture
BOUND_S = 120.0
TYPED = "tty; echo $((6 * 7)); exit 3\n"


async def test_a_pty_job_takes_keys(
    make_agent_sandbox: MakeSandbox, agent_ctd: Containerd, tmp_path: Path
) -> None:
    sandbox = await make_agent_sandbox()
    tools = ToolCallActivities("test", agent_ctd, tmp_path)
    request = SpawnRequest(cmd="/bin/sh", pty=True, rows=30, cols=100)
    info = await tools.job_spawn(SpawnInput(sandbox_id=sandbox.id, index=0, request=request))
    keys = JobStdinRequest(job=info.job, data_b64=base64.b64encode(TYPED.encode()).decode())
    await tools.job_stdin(JobStdinInput(sandbox_id=sandbox.id, request=keys))
    job = Job(cast(Episode, ActivityEpisode(tools, sandbox.id)), info.job, info.cmd)
    async with asyncio.timeout(BOUND_S):
        seen = b"".join([chunk async for chunk in job.follow()])
    assert b"/dev/pts/" in seen and b"\r\n42\r\n" in seen  # a terminal's line endings
    wait = JobRequest(job=info.job, timeout_s=BOUND_S)
    assert (await tools.job_wait(JobInput(sandbox_id=sandbox.id, request=wait))).exit_code == 3


async def test_corral_episode_shell(corral: Corral, stack_config: StackConfig) -> None:
    require_stack_agent(stack_config)
    spec = {"image": "busybox", "interactive": True}
    async with await corral.start_episode(spec) as episode:
        await episode.exec("true")  # the sandbox exists
        argv = [sys.executable, "-m", "corral", "episode", "shell", episode.id]
        # The test stack's settings are in this environment (tests/integration/conftest.py).
        done = await asyncio.to_thread(
            subprocess.run,
            argv,
            input=TYPED.encode(),
            capture_output=True,
            timeout=BOUND_S,
            env=dict(os.environ),
        )
    assert done.returncode == 3, done.stderr.decode()[-500:]
    assert b"/dev/pts/" in done.stdout and b"42" in done.stdout
