"""The exec agent end to end: a real sandbox on the stack's node, the agent as PID 1.

No timing thresholds: waits are bounded only so that a failure cannot hang the run.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from contract.errors import SandboxError, SandboxNotFound
from sandbox.agent import AgentChannel
from sandbox.client import Containerd
from sandbox.sandbox import Sandbox

MakeSandbox = Callable[..., Awaitable[Sandbox]]  # the make_agent_sandbox fixture

GONE_WAIT_S = 30.0


def channel(sandbox: Sandbox) -> AgentChannel:
    ch = sandbox.agent()
    assert ch is not None
    return ch


async def gone(sandbox: Sandbox, pid: str) -> bool:
    """The process is gone (not even a zombie: PID 1, the agent, reaped it)."""
    result = await sandbox.exec(f"test -e /proc/{pid}/stat && cat /proc/{pid}/stat")
    return result.exit_code != 0 or result.stdout.split(") ")[-1].startswith(("Z", "X"))


async def wait_gone(sandbox: Sandbox, pid: str) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + GONE_WAIT_S
    while not await gone(sandbox, pid):
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True


async def test_the_agent_is_pid_1_and_runs_calls(make_agent_sandbox: MakeSandbox) -> None:
    sandbox = await make_agent_sandbox()
    script = "echo out; echo err >&2; cat /proc/1/cmdline | tr '\\0' ' '; exit 3"
    result = await sandbox.exec(script)
    assert result.exit_code == 3
    assert result.stdout.startswith("out\n/.corral/agent -- ")
    assert result.stderr == "err\n"
    # Its stdin is delivered, argv runs without a shell, a missing user falls back to runc.
    assert (await sandbox.exec(["cat"], stdin=b"piped")).stdout == "piped"
    assert (await sandbox.exec(["id", "-u"], user="1000")).stdout.strip() == "1000"


async def test_the_agent_cannot_be_killed_or_read_by_the_sandbox(
    make_agent_sandbox: MakeSandbox,
) -> None:
    sandbox = await make_agent_sandbox()
    result = await sandbox.exec(
        "kill -9 1; cat /proc/1/environ >/dev/null 2>&1 && echo read-environ; "
        "echo x 2>/dev/null > /proc/1/fd/1 && echo wrote-channel; echo done"
    )
    assert result.stdout == "done\n"
    assert (await sandbox.exec(["true"])).exit_code == 0  # the agent lives on


async def test_a_session_keeps_its_cwd_and_environment(make_agent_sandbox: MakeSandbox) -> None:
    sandbox = await make_agent_sandbox()
    ch = channel(sandbox)
    first = await ch.run("mkdir -p /tmp/work && cd /tmp/work && export GREETING=hello", session="s")
    assert first.exit_code == 0
    second = await ch.run('pwd; echo "$GREETING"', session="s")
    assert second.stdout == b"/tmp/work\nhello\n"
    # Another session, and a plain call, start afresh.
    other = await ch.run('pwd; echo "[$GREETING]"', session="other")
    assert other.stdout != second.stdout and other.stdout.endswith(b"[]\n")
    assert (await sandbox.exec('echo "[$GREETING]"')).stdout == "[]\n"


async def test_a_background_job_outlives_its_call_and_dies_with_its_tree(
    make_agent_sandbox: MakeSandbox,
) -> None:
    sandbox = await make_agent_sandbox()
    ch = channel(sandbox)
    job = await ch.spawn(
        "sleep 300 & echo $! > /tmp/grandchild; echo $$ > /tmp/job; echo started; wait"
    )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + GONE_WAIT_S
    while (await ch.output(job)).data != b"started\n":
        assert loop.time() < deadline, "the job never printed"
        await asyncio.sleep(0.05)
    pids = (await sandbox.exec("cat /tmp/job /tmp/grandchild")).stdout.split()
    assert len(pids) == 2
    assert all([not await gone(sandbox, pid) for pid in pids])  # alive after the call returned
    assert (await ch.wait(job, timeout_s=0.1)).running
    await ch.kill(job)
    status = await ch.wait(job, timeout_s=GONE_WAIT_S)
    assert not status.running and status.signal == 9
    assert all([await wait_gone(sandbox, pid) for pid in pids])


async def test_a_timeout_kills_a_setsid_child_too(make_agent_sandbox: MakeSandbox) -> None:
    sandbox = await make_agent_sandbox()
    result = await sandbox.exec(
        "setsid sh -c 'echo $$ > /tmp/escapee; exec sleep 300' & "
        "while [ ! -s /tmp/escapee ]; do sleep 0.05; done; sleep 300",
        timeout_s=2,
    )
    assert result.timed_out and result.exit_code == 137
    escapee = (await sandbox.exec("cat /tmp/escapee")).stdout.strip()
    assert escapee
    assert await wait_gone(sandbox, escapee)


async def test_a_20_mb_file_goes_in_and_out_byte_for_byte(make_agent_sandbox: MakeSandbox) -> None:
    sandbox = await make_agent_sandbox()
    data = os.urandom(20 * 1024 * 1024)
    await sandbox.write_file("/tmp/in/big.bin", data, mode=0o600)
    inside = await sandbox.exec("sha256sum /tmp/in/big.bin; stat -c %a /tmp/in/big.bin")
    assert inside.stdout.split() == [hashlib.sha256(data).hexdigest(), "/tmp/in/big.bin", "600"]
    assert await sandbox.read_file("/tmp/in/big.bin") == data
    # stdin larger than a frame goes in stdin frames after the call
    counted = await sandbox.exec(["/bin/sh", "-c", "sha256sum | cut -d' ' -f1"], stdin=data)
    assert counted.stdout.strip() == hashlib.sha256(data).hexdigest()
    # and a process that stops reading early ends the call all the same
    head = await sandbox.exec(["head", "-c", "3"], stdin=b"xyz" + data)
    assert (head.exit_code, head.stdout) == (0, "xyz")


async def test_a_pty_call_sees_a_terminal(make_agent_sandbox: MakeSandbox) -> None:
    sandbox = await make_agent_sandbox()
    ch = channel(sandbox)
    result = await ch.run("test -t 0 && test -t 1 && tty", pty=True)
    assert result.exit_code == 0
    assert result.stdout.strip().startswith(b"/dev/pts/")
    plain = await ch.run("test -t 1 || echo no-tty")
    assert plain.stdout == b"no-tty\n"


async def test_a_durable_step_runs_through_the_agent(
    make_agent_sandbox: MakeSandbox, tmp_path: Path
) -> None:
    sandbox = await make_agent_sandbox()
    out = tmp_path / "step"
    cmd = ["/bin/sh", "-c", "echo step; echo ran >> /tmp/runs"]
    raw = await sandbox.exec_durable(cmd, exec_id="s-1", output_dir=out)
    assert (raw.exit_code, raw.stdout) == (0, b"step\n")
    assert (out / "agent").exists()
    # The agent's channel dies with its worker: a reattach (a worker that died
    # before journaling the result) reports the call lost, never reruns it.
    with pytest.raises(SandboxError, match="lost with its worker"):
        await sandbox.reattach_exec("s-1", out, timeout_s=5)
    assert (await sandbox.exec(["cat", "/tmp/runs"])).stdout == "ran\n"


async def test_a_call_cut_off_by_the_sandbox_s_end_raises_sandbox_not_found(
    make_agent_sandbox: MakeSandbox, agent_ctd: Containerd
) -> None:
    sandbox = await make_agent_sandbox()
    call = asyncio.ensure_future(sandbox.exec("sleep 300"))
    await asyncio.sleep(0.2)  # let the call start; either way it must not hang
    await agent_ctd.destroy_sandbox(sandbox.id)
    with pytest.raises(SandboxNotFound):
        await asyncio.wait_for(call, GONE_WAIT_S)


async def test_a_cancelled_call_has_its_process_killed(make_agent_sandbox: MakeSandbox) -> None:
    sandbox = await make_agent_sandbox()
    call = asyncio.ensure_future(sandbox.exec("echo $$ > /tmp/p; exec sleep 300"))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + GONE_WAIT_S
    while not (pid := (await sandbox.exec("cat /tmp/p 2>/dev/null")).stdout.strip()):
        assert loop.time() < deadline, "the call never started"
        await asyncio.sleep(0.05)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert await wait_gone(sandbox, pid)


@pytest.mark.parametrize("died_mid_frame", [False, True], ids=["between-frames", "mid-frame"])
async def test_a_later_process_attaches_to_the_running_agent(
    make_agent_sandbox: MakeSandbox, agent_ctd: Containerd, died_mid_frame: bool
) -> None:
    """What a node worker that restarts finds: the agent still running, its FIFOs
    held open by the shim. The new channel is heard, and the session goes on,
    even when the old process died halfway through writing a frame."""
    from sandbox import agent as agent_module

    sandbox = await make_agent_sandbox()
    old = channel(sandbox)
    made = await old.run("cd /tmp && export MARK=kept", session="main")
    assert made.exit_code == 0
    if died_mid_frame:  # the head of a 100 KB file write, and no more
        frame = agent_module.encode_frame(77, {"op": "put", "path": "/tmp/f"}, b"x" * 100_000)
        os.write(old._in_fd, frame[:4096])
    # The old process is gone: its channel closed, its FIFOs left as they were.
    agent_module._CHANNELS.pop(str(old.dir))
    old.close()
    assert sandbox.agent() is None

    attached = await agent_ctd.attach_agent(sandbox.id)
    assert attached is not None and attached is not old
    again = await attached.run("pwd; echo $MARK", session="main")
    assert (again.exit_code, again.stdout) == (0, b"/tmp\nkept\n")
    assert sandbox.agent() is attached  # every later call of this process uses it
