"""Streaming a command's output (`Job.follow`, `Episode.stream`, `corral episode exec
--follow`): chunks come in order while the command still runs.

No timing thresholds: the command waits for a file the test makes only after it
has received the first lines, so "before the command ends" holds by
construction; every wait is bounded only so that a failure cannot hang the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, cast

from activities.toolcalls import JobInput, JobRequest, SpawnInput, SpawnRequest, ToolCallActivities
from contract.config import StackConfig
from corral.sdk import Corral, Episode, Job
from sandbox.client import Containerd
from sandbox.sandbox import Sandbox
from tests.integration.conftest import require_stack_agent

MakeSandbox = Callable[..., Awaitable[Sandbox]]  # the make_agent_sandbox fixture
BOUND_S = 120.0
# Prints 1..3, then blocks until /tmp/go exists, then prints "after".
GATED = "for i in 1 2 3; do echo $i; done; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo after"


class ActivityEpisode:
    """The Updates `Job.follow` sends, answered by the node's activities directly
    (no Temporal): `follow`'s logic on a real agent and real activities."""

    def __init__(self, tools: ToolCallActivities, sandbox_id: str) -> None:
        self.id = sandbox_id
        self._tools, self._sandbox_id = tools, sandbox_id

    async def _update(self, name: str, request: JobRequest, _: Any) -> Any:
        call = JobInput(sandbox_id=self._sandbox_id, request=request)
        handlers = {"job_output": self._tools.job_output, "job_wait": self._tools.job_wait}
        return await handlers[name](call)


async def read_until(chunks: AsyncIterator[bytes], seen: bytearray, wanted: bytes) -> None:
    while wanted not in seen:
        seen += await anext(chunks)


async def gated_stream(
    chunks: AsyncIterator[bytes], open_gate: Callable[[], Awaitable[None]]
) -> bytes:
    """Read up to "3", open the gate (the command was blocked until then), read the rest."""
    seen = bytearray()
    async with asyncio.timeout(BOUND_S):
        await read_until(chunks, seen, b"3\n")
        assert b"after" not in seen  # it cannot have run yet: the gate is shut
        await open_gate()
        async for chunk in chunks:
            seen += chunk
    return bytes(seen)


async def test_follow_yields_output_before_the_command_ends(
    make_agent_sandbox: MakeSandbox, agent_ctd: Containerd, tmp_path: Path
) -> None:
    sandbox = await make_agent_sandbox()
    tools = ToolCallActivities("test", agent_ctd, tmp_path)
    spawn = SpawnInput(sandbox_id=sandbox.id, index=0, request=SpawnRequest(cmd=GATED))
    info = await tools.job_spawn(spawn)
    job = Job(cast(Episode, ActivityEpisode(tools, sandbox.id)), info.job, info.cmd)

    async def open_gate() -> None:
        assert (await sandbox.exec("touch /tmp/go")).ok

    assert await gated_stream(job.follow(), open_gate) == b"1\n2\n3\nafter\n"
    assert (await job.wait(timeout_s=BOUND_S)).exit_code == 0


async def test_sdk_stream(corral: Corral, stack_config: StackConfig) -> None:
    require_stack_agent(stack_config)
    spec = {"image": "busybox", "interactive": True}
    async with await corral.start_episode(spec) as episode:

        async def open_gate() -> None:
            assert (await episode.exec("touch /tmp/go")).exit_code == 0

        assert await gated_stream(episode.stream(GATED), open_gate) == b"1\n2\n3\nafter\n"
        # Leaving a stream early (closed) kills the command's tree: nothing of it runs on.
        async with contextlib.aclosing(episode.stream("echo x; exec sleep 300")) as chunks:
            async for _ in chunks:
                break
        async with asyncio.timeout(BOUND_S):
            while (await episode.exec("pgrep -x sleep")).exit_code == 0:
                await asyncio.sleep(0.2)
        # The CLI: stdout as it comes, then stderr, and the command's status.
        script = "echo one; echo two; echo oops >&2; exit 4"
        argv = [sys.executable, "-m", "corral", "episode", "exec", "--follow", episode.id]
        done = await asyncio.to_thread(
            subprocess.run, [*argv, "sh", "-c", script], capture_output=True, timeout=BOUND_S
        )
    assert (done.returncode, done.stdout, done.stderr) == (4, b"one\ntwo\n", b"oops\n")
