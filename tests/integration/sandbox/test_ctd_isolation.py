"""Isolation and limits, observed from inside real sandboxes."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from contract.errors import SandboxPaused
from sandbox.client import Containerd
from sandbox.models import SandboxEvent
from sandbox.sandbox import Sandbox

pytestmark = pytest.mark.integration

MakeSandbox = Callable[..., Awaitable[Sandbox]]

# A static probe that calls one syscall and prints its errno (0 = allowed).
PROBE_C = r"""
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>
int main(int argc, char **argv) {
    long r = -1;
    if (!strcmp(argv[1], "keyctl")) r = syscall(SYS_keyctl, 0 /* GET_KEYRING_ID */, -3, 0);
    else if (!strcmp(argv[1], "unshare_user")) r = syscall(SYS_unshare, 0x10000000);
    else if (!strcmp(argv[1], "unshare_files")) r = syscall(SYS_unshare, 0x00000400);
    else if (!strcmp(argv[1], "bpf")) r = syscall(SYS_bpf, 0, 0, 0);
    printf("%d\n", r < 0 ? errno : 0);
    return 0;
}
"""


async def test_only_loopback(make_sandbox: MakeSandbox) -> None:
    sandbox = await make_sandbox()
    assert (await sandbox.exec("ls /sys/class/net")).stdout.split() == ["lo"]


async def test_masked_and_readonly_paths(make_sandbox: MakeSandbox) -> None:
    sandbox = await make_sandbox()
    kcore = await sandbox.exec("wc -c < /proc/kcore")
    assert kcore.stdout.strip() in ("", "0")
    assert not (await sandbox.exec("echo 1 > /proc/sys/kernel/domainname")).ok
    caps = await sandbox.exec("grep CapEff /proc/self/status")
    eff = int(caps.stdout.split()[1], 16)
    assert not eff & (1 << 13)  # CAP_NET_RAW
    assert not eff & (1 << 21)  # CAP_SYS_ADMIN


async def test_seccomp_denies_mount_and_unshare(make_sandbox: MakeSandbox) -> None:
    sandbox = await make_sandbox()
    mounted = await sandbox.exec("mkdir -p /tmp/m && mount -t tmpfs none /tmp/m")
    assert not mounted.ok
    unshared = await sandbox.exec("unshare -n true")
    assert not unshared.ok


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to build the probe")
async def test_seccomp_probe(make_sandbox: MakeSandbox, tmp_path: Path) -> None:
    (tmp_path / "probe.c").write_text(PROBE_C)
    subprocess.run(
        ["gcc", "-static", "-O1", "-o", str(tmp_path / "probe"), str(tmp_path / "probe.c")],
        check=True,
    )
    sandbox = await make_sandbox()
    await sandbox.write_file("/workspace/probe", (tmp_path / "probe").read_bytes(), mode=0o755)
    eperm = "1"
    for call in ("keyctl", "unshare_user", "bpf"):
        assert (await sandbox.exec(["/workspace/probe", call])).stdout.strip() == eperm, call
    assert (await sandbox.exec(["/workspace/probe", "unshare_files"])).stdout.strip() == "0"


async def test_pause_refuses_exec_then_resume(make_sandbox: MakeSandbox) -> None:
    sandbox = await make_sandbox()
    await sandbox.pause()
    try:
        assert await sandbox.status() == "paused"
        with pytest.raises(SandboxPaused, match="paused"):
            await sandbox.exec("true")
    finally:
        await sandbox.resume()
    assert await sandbox.status() == "running"
    assert (await sandbox.exec("echo back")).stdout == "back\n"


async def test_destroy_paused_sandbox(ctd: Containerd, make_sandbox: MakeSandbox) -> None:
    sandbox = await make_sandbox()
    await sandbox.pause()
    assert await sandbox.destroy() is True
    assert sandbox.id not in await ctd.container_ids()


async def test_memory_limit_oom_kills_hog(make_sandbox: MakeSandbox) -> None:
    sandbox = await make_sandbox(memory_mb=64, tmpfs_mb=8)
    # a shell variable that doubles until the cgroup's limit is hit
    hog = await sandbox.exec('x=aaaaaaaaaaaaaaaa; while :; do x="$x$x"; done', timeout_s=60)
    assert hog.exit_code == 137 and not hog.timed_out
    assert await sandbox.status() == "running"  # PID 1 survived
    metrics = await sandbox.metrics()
    assert metrics.oom_kills >= 1
    assert (await sandbox.exec("echo alive")).stdout == "alive\n"


async def test_pids_limit_stops_fork_bomb(make_sandbox: MakeSandbox) -> None:
    bomb = await make_sandbox(pids_limit=32)
    neighbour = await make_sandbox()
    run = asyncio.ensure_future(
        bomb.exec("b() { b | b & }; b; sleep 3", timeout_s=8, output_limit_bytes=4096)
    )
    try:
        assert (await neighbour.exec("echo fine")).stdout == "fine\n"
        metrics = await bomb.metrics()
        assert metrics.pids <= 32
    finally:
        await run
    assert (await neighbour.exec("echo still fine")).ok


async def test_metrics_are_sane(make_sandbox: MakeSandbox) -> None:
    sandbox = await make_sandbox(memory_mb=256)
    await sandbox.exec("i=0; while [ $i -lt 2000 ]; do i=$((i+1)); done")
    metrics = await sandbox.metrics()
    assert metrics.memory_limit_bytes == 256 * 1024 * 1024
    assert 0 < metrics.memory_bytes < metrics.memory_limit_bytes
    assert metrics.cpu_usage_ns > 0
    assert metrics.pids >= 1
    assert metrics.oom_kills == 0


async def test_events_see_oom_and_exit(ctd: Containerd, make_sandbox: MakeSandbox) -> None:
    seen: list[SandboxEvent] = []
    got_oom = asyncio.Event()
    got_exit = asyncio.Event()

    async def collect() -> None:
        async for event in ctd.events():
            seen.append(event)
            if event.topic == "/tasks/oom":
                got_oom.set()
            if event.topic == "/tasks/exit":
                got_exit.set()

    collector = asyncio.ensure_future(collect())
    try:
        await asyncio.sleep(0.2)  # let the subscription reach containerd
        sandbox = await make_sandbox(memory_mb=32, tmpfs_mb=4)
        await sandbox.exec('x=aaaaaaaaaaaaaaaa; while :; do x="$x$x"; done', timeout_s=60)
        await asyncio.wait_for(got_oom.wait(), 20)
        await asyncio.wait_for(got_exit.wait(), 20)
    finally:
        collector.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await collector
    assert any(e.topic == "/tasks/oom" and e.sandbox_id == sandbox.id for e in seen)
    exits = [e for e in seen if e.topic == "/tasks/exit" and e.sandbox_id == sandbox.id]
    assert exits and exits[0].exec_id and exits[0].exit_status == 137
