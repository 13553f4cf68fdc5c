"""Hardening, observed in real sandboxes: init, limits, volumes, masks, seccomp, runtimes."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from pydantic import ValidationError

from contract.errors import InvalidSpec
from sandbox.client import Containerd, crun_blocker
from sandbox.daemon import ContainerdDaemon
from sandbox.models import SandboxSpec
from sandbox.sandbox import Sandbox
from sandbox.spec import EXEC_OOM_SCORE_ADJ, INIT_OOM_SCORE_ADJ, MASKED_PATHS

pytestmark = pytest.mark.integration

MakeSandbox = Callable[..., Awaitable[Sandbox]]
CGROUP = Path("/sys/fs/cgroup")

ORPHANS = "i=0; while [ $i -lt 40 ]; do (sleep 0 &); i=$((i+1)); done; echo forked $i"
COUNT_ZOMBIES = "grep -l '^State:.*Z' /proc/[0-9]*/status 2>/dev/null | wc -l"

# One syscall per argument; prints its errno (0 = allowed).
PROBE_C = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <linux/sched.h>
int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        long r = -1; const char *c = argv[i];
        errno = 0;
        if (!strcmp(c, "ptrace")) r = syscall(SYS_ptrace, 0 /* TRACEME */, 0, 0, 0);
        else if (!strcmp(c, "perf_event_open")) r = syscall(SYS_perf_event_open, 0, 0, -1, -1, 0);
        else if (!strcmp(c, "setns")) r = syscall(SYS_setns, 0, 0);
        else if (!strcmp(c, "userfaultfd")) r = syscall(SYS_userfaultfd, 0);
        else if (!strcmp(c, "io_uring_setup")) r = syscall(SYS_io_uring_setup, 1, 0);
        else if (!strcmp(c, "open_by_handle_at")) r = syscall(SYS_open_by_handle_at, 0, 0, 0);
        else if (!strcmp(c, "keyctl")) r = syscall(SYS_keyctl, 0, -3, 0);
        else if (!strcmp(c, "bpf")) r = syscall(SYS_bpf, 0, 0, 0);
        else if (!strcmp(c, "unshare_net")) r = syscall(SYS_unshare, 0x40000000);
        else if (!strcmp(c, "unshare_user")) r = syscall(SYS_unshare, 0x10000000);
        else if (!strcmp(c, "clone_newuser")) r = syscall(SYS_clone, 0x10000000 | 17, 0, 0, 0, 0);
        else if (!strcmp(c, "clone3")) {
            struct clone_args a = {0}; r = syscall(SYS_clone3, &a, sizeof a);
        }
        else if (!strcmp(c, "mount")) r = syscall(SYS_mount, "none", "/tmp", "tmpfs", 0, 0);
        else if (!strcmp(c, "kexec_load")) r = syscall(SYS_kexec_load, 0, 0, 0, 0);
        else if (!strcmp(c, "getpid")) r = syscall(SYS_getpid);
        if (r == 0 && !strcmp(c, "clone_newuser")) _exit(0);
        printf("%s=%d\n", c, r < 0 ? errno : 0);
    }
    return 0;
}
"""
DENIED_BY_SECCOMP = (
    "ptrace",
    "perf_event_open",
    "setns",
    "userfaultfd",
    "io_uring_setup",
    "open_by_handle_at",
    "keyctl",
    "bpf",
    "unshare_net",
    "unshare_user",
    "clone_newuser",
    "mount",
    "kexec_load",
)


async def _status_becomes(sandbox: Sandbox, wanted: str, tries: int = 200) -> str:
    status = await sandbox.status()
    for _ in range(tries):
        if status == wanted:
            break
        await asyncio.sleep(0.05)
        status = await sandbox.status()
    return status


async def _until_running_under_init(sandbox: Sandbox) -> None:
    for _ in range(100):
        if "sleep" in (await sandbox.exec("ps -o comm")).stdout:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("sleep never started under the init")


async def _init_pid(ctd: Containerd, sandbox: Sandbox) -> int:
    info = next(i for i in await ctd.list_sandboxes() if i.id == sandbox.id)
    assert info.pid is not None
    return info.pid


# -- init ---------------------------------------------------------------------


@pytest.mark.parametrize("init", ["catatonit", "tini"])
async def test_the_init_is_pid1_and_reaps_orphans(make_sandbox: MakeSandbox, init: str) -> None:
    sandbox = await make_sandbox(pids_limit=64, init=init)
    assert (await sandbox.exec("cat /proc/1/comm")).stdout.strip().startswith("init")
    forked = await sandbox.exec(ORPHANS)
    assert forked.ok and forked.stdout == "forked 40\n"
    zombies = (await sandbox.exec(COUNT_ZOMBIES)).stdout.strip()
    for _ in range(50):  # the init reaps on SIGCHLD; give a loaded machine a few rounds
        if zombies == "0":
            break
        await asyncio.sleep(0.05)
        zombies = (await sandbox.exec(COUNT_ZOMBIES)).stdout.strip()
    assert zombies == "0"


async def test_without_init_orphans_stay_zombies(make_sandbox: MakeSandbox) -> None:
    """The bug the init fixes: `sleep` as PID 1 never reaps, zombies use up pids_limit."""
    sandbox = await make_sandbox(init="none", pids_limit=64)
    assert (await sandbox.exec("cat /proc/1/comm")).stdout.strip() == "sleep"
    assert (await sandbox.exec(ORPHANS)).ok
    assert int((await sandbox.exec(COUNT_ZOMBIES)).stdout) >= 40


async def test_sigterm_stops_sandbox_and_teardown_works(
    ctd: Containerd, make_sandbox: MakeSandbox
) -> None:
    sandbox = await make_sandbox()
    # Once `sleep` runs under the init, the init has blocked its signals and waits for
    # them; a SIGTERM sent in the instant before is dropped by the kernel (a
    # namespace's init with a default disposition), so send again if needed.
    await _until_running_under_init(sandbox)
    init_pid = await _init_pid(ctd, sandbox)
    status = "running"
    for _ in range(5):
        os.kill(init_pid, signal.SIGTERM)  # the init forwards it to `sleep`
        status = await _status_becomes(sandbox, "stopped", tries=40)
        if status == "stopped":
            break
    assert status == "stopped"
    assert await sandbox.destroy() is True
    assert sandbox.id not in await ctd.container_ids()


async def test_bad_command_fails_create_under_the_init(ctd: Containerd) -> None:
    from contract.errors import SandboxStartFailed

    spec = SandboxSpec(image="busybox", command=["no-such-binary"])
    with pytest.raises(SandboxStartFailed, match="no-such-binary"):
        await ctd.create_sandbox("badcmd-1", spec)
    assert "badcmd-1" not in await ctd.container_ids()


# -- limits -------------------------------------------------------------------


async def test_cgroup_limits_and_nofile(make_sandbox: MakeSandbox) -> None:
    sandbox = await make_sandbox(
        cpu_cores=0.5,
        cpu_shares=256,
        memory_mb=128,
        swap_mb=32,
        pids_limit=50,
        nofile=4096,
        tmpfs_mb=16,
    )
    leaf = f"corral/{sandbox.id}"
    assert (CGROUP / "cpu" / leaf / "cpu.cfs_quota_us").read_text().strip() == "50000"
    assert (CGROUP / "cpu" / leaf / "cpu.cfs_period_us").read_text().strip() == "100000"
    assert (CGROUP / "cpu" / leaf / "cpu.shares").read_text().strip() == "256"
    mem = CGROUP / "memory" / leaf
    assert int((mem / "memory.limit_in_bytes").read_text()) == 128 << 20
    if (mem / "memory.memsw.limit_in_bytes").exists():
        assert int((mem / "memory.memsw.limit_in_bytes").read_text()) == 160 << 20
    assert (CGROUP / "pids" / leaf / "pids.max").read_text().strip() == "50"
    assert (await sandbox.exec("ulimit -n")).stdout.strip() == "4096"
    df = (await sandbox.exec("df -k /tmp /dev/shm | tail -n 2")).stdout.split("\n")
    assert all(line.split()[1] == str(16 * 1024) for line in df if line)


async def test_oom_in_child_spares_init(ctd: Containerd, make_sandbox: MakeSandbox) -> None:
    sandbox = await make_sandbox(memory_mb=48, tmpfs_mb=4)
    init_pid = await _init_pid(ctd, sandbox)
    assert Path(f"/proc/{init_pid}/oom_score_adj").read_text().strip() == str(INIT_OOM_SCORE_ADJ)
    # The host raises an exec's score right after Start (runc 1.1 ignores it in the spec).
    adj = await sandbox.exec(
        f'i=0; while [ $i -lt 200 ] && [ "$(cat /proc/$$/oom_score_adj)" '
        f"!= {EXEC_OOM_SCORE_ADJ} ]; do i=$((i+1)); usleep 10000; done; "
        "cat /proc/$$/oom_score_adj"
    )
    assert adj.stdout.strip() == str(EXEC_OOM_SCORE_ADJ)
    hog = await sandbox.exec('x=aaaaaaaaaaaaaaaa; while :; do x="$x$x"; done', timeout_s=60)
    assert hog.exit_code == 137 and not hog.timed_out
    assert (await sandbox.metrics()).oom_kills >= 1
    assert await sandbox.status() == "running"
    assert await _init_pid(ctd, sandbox) == init_pid  # the same PID 1, and its `sleep`
    assert "sleep" in (await sandbox.exec("ps -o comm")).stdout
    assert (await sandbox.exec("echo alive")).stdout == "alive\n"


async def test_workspace_volume_bounds_disk(ctd: Containerd, make_sandbox: MakeSandbox) -> None:
    sandbox = await make_sandbox(workspace_mb=16, read_only_root=True, user="1000:1000")
    image = ctd.workspace_root / f"{sandbox.id}.img"
    assert image.is_file()
    fill = await sandbox.exec("dd if=/dev/zero of=/workspace/fill bs=1M count=64", timeout_s=60)
    assert fill.exit_code != 0 and "No space left" in fill.stderr
    assert image.stat().st_blocks * 512 <= 17 << 20  # host disk used: at most the volume
    assert (await sandbox.exec("rm /workspace/fill && echo x > /workspace/small")).ok
    root = await sandbox.exec("echo x > /etc/new")
    assert root.exit_code != 0 and "Read-only" in root.stderr
    await sandbox.destroy()
    assert not image.exists() and not (ctd.workspace_root / sandbox.id).exists()


# -- read-only root, masked paths, seccomp ---------------------------------------


async def test_read_only_root(make_sandbox: MakeSandbox) -> None:
    sandbox = await make_sandbox(read_only_root=True)
    for target in ("/bin/sh", "/etc/passwd", "/newfile", "/workspace/x"):
        res = await sandbox.exec(f"echo x > {target}")
        assert res.exit_code != 0 and "Read-only" in res.stderr, target
    assert (await sandbox.exec("echo x > /tmp/ok && cat /tmp/ok")).stdout == "x\n"
    assert (await sandbox.exec("echo x > /dev/shm/ok")).ok


async def test_every_masked_path_is_empty(make_sandbox: MakeSandbox) -> None:
    sandbox = await make_sandbox()
    script = (
        'for p in "$@"; do [ -e "$p" ] || continue; '
        'if [ -d "$p" ]; then echo "$p $(ls -A "$p" | wc -l)"; '
        'else echo "$p $(head -c 64 "$p" 2>/dev/null | wc -c)"; fi; done'
    )
    res = await sandbox.exec(["/bin/sh", "-c", script, "sh", *MASKED_PATHS])
    seen = dict(line.rsplit(" ", 1) for line in res.stdout.splitlines())
    on_host = {p for p in MASKED_PATHS if Path(p).exists()}
    assert on_host <= set(seen) and "/proc/kpagecgroup" in seen
    assert all(count == "0" for count in seen.values()), seen
    if Path("/proc/sysrq-trigger").exists():
        sysrq = await sandbox.exec("stat -c %t:%T /proc/sysrq-trigger")
        assert sysrq.stdout.strip() == "1:3"  # /dev/null bound over it


async def test_proc_and_sys_writes_refused(make_sandbox: MakeSandbox) -> None:
    sandbox = await make_sandbox()
    for target in (
        "/proc/sys/kernel/hostname",
        "/sys/kernel/mm/ksm/run",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
        "/proc/sys/vm/drop_caches",
    ):
        res = await sandbox.exec(f"echo 1 > {target}")
        assert res.exit_code != 0, target


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to build the probe")
async def test_seccomp_denies_each_listed_call(make_sandbox: MakeSandbox, tmp_path: Path) -> None:
    (tmp_path / "probe.c").write_text(PROBE_C)
    subprocess.run(
        ["gcc", "-static", "-O1", "-o", str(tmp_path / "probe"), str(tmp_path / "probe.c")],
        check=True,
    )
    sandbox = await make_sandbox()
    await sandbox.write_file("/workspace/probe", (tmp_path / "probe").read_bytes(), mode=0o755)
    res = await sandbox.exec(["/workspace/probe", *DENIED_BY_SECCOMP, "clone3", "getpid"])
    errnos = dict(line.split("=") for line in res.stdout.split())
    assert {call: errnos[call] for call in DENIED_BY_SECCOMP} == dict.fromkeys(
        DENIED_BY_SECCOMP, "1"
    )  # EPERM
    assert errnos["clone3"] == "38"  # ENOSYS: libc falls back to clone
    assert errnos["getpid"] == "0"


# -- runtimes and shims ---------------------------------------------------------


async def test_crun_runs_or_is_refused_clearly(make_sandbox: MakeSandbox) -> None:
    if shutil.which("crun") is None:
        pytest.skip("crun not installed")
    if crun_blocker() is not None:
        with pytest.raises(InvalidSpec, match=r"crun.*hugetlb"):
            await make_sandbox(runtime="crun")
        return
    sandbox = await make_sandbox(runtime="crun", memory_mb=64, tmpfs_mb=8, pids_limit=32)
    assert (await sandbox.exec("echo ok")).stdout == "ok\n"
    assert (await sandbox.exec("ls /sys/class/net")).stdout.split() == ["lo"]
    assert not (await sandbox.exec("mount -t tmpfs none /tmp")).ok
    hog = await sandbox.exec('x=aaaaaaaaaaaaaaaa; while :; do x="$x$x"; done', timeout_s=60)
    assert hog.exit_code == 137
    assert (await sandbox.exec("echo alive")).ok


def test_runsc_absent_is_named() -> None:
    if shutil.which("runsc"):
        pytest.skip("runsc is installed here")
    with pytest.raises(ValidationError, match=r"runsc.*gVisor"):
        SandboxSpec(image="busybox", runtime="runsc")


async def test_shim_group_serves_several_sandboxes(
    ctd: Containerd, ctd_daemon: ContainerdDaemon, make_sandbox: MakeSandbox
) -> None:
    group = "grp-test-1"
    boxes = [await make_sandbox(shim_group=group) for _ in range(3)]
    for box in boxes:
        assert (await box.exec("echo ok")).ok
    parents = set()
    for box in boxes:
        init = await _init_pid(ctd, box)
        status = Path(f"/proc/{init}/status").read_text()
        parents.add(int(status.split("PPid:")[1].split()[0]))
    assert len(parents) == 1  # one shim is the parent of every init in the group
    assert parents <= set(ctd_daemon.shim_pids())
