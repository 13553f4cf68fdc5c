"""A hostile agent, on real containerd: each offence has a clear outcome and stays contained.

After every offence: a neighbour sandbox still answers exec, a TCP service on
the host's 127.0.0.1 still serves, the offender tears down, and the session
fixture finds nothing left over. Every address used is on this machine, and
every loop is bounded (by count, by the pids limit, or by an exec timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from netns_server import server_namespace, sh

from contract.errors import NetworkError, SandboxStartFailed
from sandbox import network
from sandbox.client import Containerd
from sandbox.models import ImageInfo, SandboxSpec
from sandbox.sandbox import Sandbox

pytestmark = pytest.mark.integration

MakeSandbox = Callable[..., Awaitable[Sandbox]]


class HostService:
    """A TCP service on the host's loopback: it must keep serving, unreachable from sandboxes."""

    def __init__(self, server: asyncio.Server) -> None:
        self.server = server
        self.port: int = server.sockets[0].getsockname()[1]

    async def serving(self) -> bool:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            return await reader.readline() == b"hello\n"
        finally:
            writer.close()


@pytest.fixture
async def host_service() -> AsyncIterator[HostService]:
    async def greet(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"hello\n")
        await w.drain()
        w.close()

    server = await asyncio.start_server(greet, "127.0.0.1", 0)
    try:
        yield HostService(server)
    finally:
        server.close()


@pytest.fixture
async def neighbour(make_sandbox: MakeSandbox) -> Sandbox:
    box = await make_sandbox()
    await box.exec("echo mine > /workspace/secret")
    return box


async def contained(
    ctd: Containerd, offender: Sandbox, neighbour: Sandbox, service: HostService
) -> None:
    """The checks after every offence."""
    assert (await neighbour.exec("cat /workspace/secret")).stdout == "mine\n"
    assert await service.serving()
    await offender.destroy()
    assert offender.id not in await ctd.container_ids()
    assert offender.id not in await ctd.task_ids()
    assert (await neighbour.exec("echo still here")).ok


async def test_fork_bomb(
    ctd: Containerd, make_sandbox: MakeSandbox, neighbour: Sandbox, host_service: HostService
) -> None:
    bomb = await make_sandbox(pids_limit=32, cpu_cores=0.5)
    run = asyncio.ensure_future(
        bomb.exec("b() { b | b & }; b; wait", timeout_s=4, output_limit_bytes=4096)
    )
    assert (await neighbour.exec("echo fine")).ok  # while the bomb goes off
    result = await run
    # Either the bomb was still going at the timeout (killed), or it ran out of pids.
    assert result.timed_out or "can't fork" in result.stderr
    assert (await bomb.metrics()).pids <= 32
    await contained(ctd, bomb, neighbour, host_service)


async def test_memory_hog(
    ctd: Containerd, make_sandbox: MakeSandbox, neighbour: Sandbox, host_service: HostService
) -> None:
    hog = await make_sandbox(memory_mb=48, tmpfs_mb=4)
    result = await hog.exec('x=aaaaaaaaaaaaaaaa; while :; do x="$x$x"; done', timeout_s=60)
    assert result.exit_code == 137 and not result.timed_out
    assert (await hog.metrics()).oom_kills >= 1
    assert (await hog.exec("echo alive")).ok  # PID 1 was spared
    await contained(ctd, hog, neighbour, host_service)


async def test_disk_fill(
    ctd: Containerd, make_sandbox: MakeSandbox, neighbour: Sandbox, host_service: HostService
) -> None:
    filler = await make_sandbox(workspace_mb=16, read_only_root=True, tmpfs_mb=8)
    ws = await filler.exec("dd if=/dev/zero of=/workspace/f bs=1M count=100", timeout_s=60)
    assert ws.exit_code != 0 and "No space left" in ws.stderr
    tmp = await filler.exec("dd if=/dev/zero of=/tmp/f bs=1M count=100", timeout_s=60)
    assert tmp.exit_code != 0 and "No space left" in tmp.stderr
    root = await filler.exec("dd if=/dev/zero of=/f bs=1M count=1")
    assert root.exit_code != 0 and "Read-only" in root.stderr
    image = ctd.workspace_root / f"{filler.id}.img"
    assert image.stat().st_blocks * 512 <= 17 << 20
    await contained(ctd, filler, neighbour, host_service)
    assert not image.exists()


async def test_log_flood(
    ctd: Containerd, make_sandbox: MakeSandbox, neighbour: Sandbox, host_service: HostService
) -> None:
    flood = await make_sandbox()
    limit = 64 * 1024
    result = await flood.exec(
        "head -c 50000000 /dev/zero | tr '\\0' a; echo done >&2",
        output_limit_bytes=limit,
        timeout_s=60,
    )
    assert result.exit_code == 0 and not result.timed_out
    assert result.truncated
    assert len(result.stdout) + len(result.stderr) <= limit
    assert set(result.stdout) == {"a"}
    await contained(ctd, flood, neighbour, host_service)


async def test_overwrite_bin_sh(
    ctd: Containerd, make_sandbox: MakeSandbox, neighbour: Sandbox, host_service: HostService
) -> None:
    vandal = await make_sandbox()
    host_busybox = hashlib.sha256(Path("/bin/busybox").read_bytes()).hexdigest()
    # Writing into the running binary is ETXTBSY; unlink and replace it (and /bin/sh)
    # instead. The change lands in this sandbox's writable layer only.
    wrecked = await vandal.exec(
        [
            "/bin/busybox",
            "sh",
            "-c",
            "cp /bin/busybox /tmp/busybox"
            " && /tmp/busybox rm -f /bin/sh /bin/busybox"
            " && printf junk > /bin/busybox && printf junk > /bin/sh"
            " && /tmp/busybox chmod 755 /bin/sh /bin/busybox",
        ]
    )
    assert wrecked.ok, wrecked.stderr
    broken = await vandal.exec("echo hi")  # its own /bin/sh is junk now
    assert broken.exit_code != 0 and "exec format error" in broken.stderr
    fresh = await make_sandbox()
    for box in (neighbour, fresh):
        sha = await box.exec("sha256sum /bin/busybox")
        assert sha.stdout.split()[0] == host_busybox
    await contained(ctd, vandal, neighbour, host_service)


async def test_scan_host_loopback(
    ctd: Containerd, make_sandbox: MakeSandbox, neighbour: Sandbox, host_service: HostService
) -> None:
    scanner = await make_sandbox()
    ports = [host_service.port, 22, 80, 443, 2375, 7233, 8233, 10250]
    script = (
        "for p in " + " ".join(map(str, ports)) + "; do "
        "if nc -w 1 127.0.0.1 $p </dev/null >/dev/null 2>&1; then echo open $p; fi; "
        "done; echo scanned"
    )
    result = await scanner.exec(script, timeout_s=60)
    assert result.stdout == "scanned\n"  # nothing open: its loopback is its own
    assert (await scanner.exec("ls /sys/class/net")).stdout.split() == ["lo"]
    assert not (await scanner.exec("nc -w 1 10.0.2.2 22 </dev/null", timeout_s=10)).ok
    await contained(ctd, scanner, neighbour, host_service)


async def test_read_other_sandbox_files(
    ctd: Containerd, make_sandbox: MakeSandbox, neighbour: Sandbox, host_service: HostService
) -> None:
    snoop = await make_sandbox()
    search = await snoop.exec(
        "find / -path /proc -prune -o -path /sys -prune -o -name secret -print; "
        "cat /proc/*/root/workspace/secret 2>/dev/null; ls /proc | grep -c '^[0-9]'",
        timeout_s=60,
    )
    assert "mine" not in search.stdout
    assert "/workspace/secret" not in search.stdout
    assert int(search.stdout.split()[-1]) < 10  # only its own few processes are visible
    await contained(ctd, snoop, neighbour, host_service)


async def test_proc_and_sys_tricks(
    ctd: Containerd, make_sandbox: MakeSandbox, neighbour: Sandbox, host_service: HostService
) -> None:
    trickster = await make_sandbox()
    # 'h' only prints help if it ever reached the kernel; the trigger is masked anyway.
    sysrq = await trickster.exec("echo h > /proc/sysrq-trigger; cat /proc/sysrq-trigger | wc -c")
    assert sysrq.stdout.strip().endswith("0")
    kcore = await trickster.exec("head -c 16 /proc/kcore 2>/dev/null | wc -c")
    assert kcore.stdout.strip() == "0"
    for target in (
        "/sys/kernel/mm/ksm/run",
        "/sys/kernel/uevent_helper",
        "/proc/sys/kernel/core_pattern",
        "/proc/sys/vm/drop_caches",
    ):
        res = await trickster.exec(f"echo 1 > {target}")
        assert res.exit_code != 0, target
    assert (await trickster.exec("head -c 8 /proc/kpageflags | wc -c")).stdout.strip() == "0"
    await contained(ctd, trickster, neighbour, host_service)


async def test_mount_unshare_ptrace(
    ctd: Containerd, make_sandbox: MakeSandbox, neighbour: Sandbox, host_service: HostService
) -> None:
    escaper = await make_sandbox()
    for cmd in (
        "mount -t tmpfs none /tmp",
        "mount -o remount,rw /proc/sys",
        "mount --bind / /tmp",
        "umount /proc/kcore",
        "unshare -U true",
        "unshare -n true",
        "unshare -m true",
        "unshare -p -f true",
        "nsenter -t 1 -n true",
        "chroot / true && mknod /tmp/sda b 8 0",
    ):
        res = await escaper.exec(cmd, timeout_s=10)
        assert res.exit_code != 0 and not res.timed_out, cmd
    # ptrace: busybox has no strace; the attach attempt goes through /proc/<pid>/mem
    mem = await escaper.exec("dd if=/proc/1/mem bs=1 count=1 skip=4096 2>&1")
    assert (
        "Operation not permitted" in mem.stdout
        or "Permission denied" in mem.stdout
        or mem.exit_code != 0
    )
    await contained(ctd, escaper, neighbour, host_service)


async def test_kill_all_inside(
    ctd: Containerd, make_sandbox: MakeSandbox, neighbour: Sandbox, host_service: HostService
) -> None:
    killer = await make_sandbox()
    result = await killer.exec("kill -9 -1; sleep 5; echo survived", timeout_s=30)
    # tini's child died, so tini exits and the kernel ends the pid namespace: the
    # sandbox is gone, and so is this exec (SIGKILL), well before its timeout.
    assert result.exit_code == 137 and not result.timed_out and "survived" not in result.stdout
    status = await killer.status()
    for _ in range(200):
        if status == "stopped":
            break
        await asyncio.sleep(0.05)
        status = await killer.status()
    assert status == "stopped"
    # The whole group is gone, not just the exec's parent: no process is left in any of
    # the sandbox's cgroups (runc may already have removed them).
    for controller in ("pids", "memory", "cpu", "blkio"):
        procs = CGROUP / controller / "corral" / killer.id / "cgroup.procs"
        with contextlib.suppress(FileNotFoundError):
            assert procs.read_text().split() == [], controller
    await contained(ctd, killer, neighbour, host_service)


# -- egress allowlist through create_sandbox -------------------------------------

SRV_NS = "corral-test-srv2"
SRV_HOST_IF = "crtsrv2"
SRV_HOST_ADDR, SRV_ADDR = "198.19.255.2", "198.19.255.3"
ALLOWED, DENIED = 7101, 7102
SERVER = r"""
import socket, sys, threading, time
def tcp(port):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(16)
    while True:
        c, _ = s.accept(); c.sendall(b"hello\n"); c.close()
for p in sys.argv[1].split(","):
    threading.Thread(target=tcp, args=(int(p),), daemon=True).start()
print("ready", flush=True)
time.sleep(float(sys.argv[2]))  # bounded lifetime even if the test dies
"""
NC = "nc -w 2 {} {} </dev/null"


@pytest.fixture
def server_ns() -> Iterator[None]:
    if not shutil.which("nft") or not shutil.which("ip"):
        pytest.skip("needs nft and ip")
    argv = [sys.executable, "-c", SERVER, f"{ALLOWED},{DENIED}", "120"]
    with server_namespace(SRV_NS, SRV_HOST_IF, SRV_HOST_ADDR, SRV_ADDR, argv):
        yield


async def test_allowlist_through_create_sandbox(
    ctd: Containerd, make_sandbox: MakeSandbox, server_ns: None, host_service: HostService
) -> None:
    box = await make_sandbox(
        network="allowlist", egress=[{"cidr": f"{SRV_ADDR}/32", "port": ALLOWED}]
    )
    att = await box.network_attachment()
    assert att is not None and att.host_ifname in sh("ip", "-o", "link").stdout
    assert (await box.exec("ls /sys/class/net")).stdout.split() == ["eth0", "lo"]
    assert (await box.exec(NC.format(SRV_ADDR, ALLOWED), timeout_s=10)).stdout == "hello\n"
    assert not (await box.exec(NC.format(SRV_ADDR, DENIED), timeout_s=10)).ok
    assert not (await box.exec(NC.format(att.host_address, host_service.port), timeout_s=10)).ok
    assert not (await box.exec(NC.format("127.0.0.1", host_service.port), timeout_s=10)).ok

    # create is idempotent: the same sandbox, the same attachment
    again = await ctd.create_sandbox(
        box.id,
        SandboxSpec(
            image="busybox",
            network="allowlist",
            egress=[network.EgressRule(cidr=f"{SRV_ADDR}/32", port=ALLOWED)],
        ),
    )
    assert again.id == box.id and (await again.network_attachment()) == att

    assert await box.cut_network() is True
    assert not (await box.exec(NC.format(SRV_ADDR, ALLOWED), timeout_s=10)).ok
    assert await box.restore_network() is True
    assert (await box.exec(NC.format(SRV_ADDR, ALLOWED), timeout_s=10)).stdout == "hello\n"

    await box.destroy()
    assert await box.network_attachment() is None
    assert att.host_ifname not in sh("ip", "-o", "link").stdout
    assert await host_service.serving()


async def test_no_network_sandbox_has_nothing_to_cut(make_sandbox: MakeSandbox) -> None:
    box = await make_sandbox()
    assert await box.cut_network() is False and await box.restore_network() is False


async def test_failed_attach_rolls_back_the_sandbox(
    ctd: Containerd, busybox: ImageInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*_a: object, **_k: object) -> None:
        raise NetworkError("sandbox netfail-1: create veth crl1 failed: simulated")

    monkeypatch.setattr(network, "attach_network", broken)
    before = (await ctd.container_ids(), await ctd.snapshot_keys(active_only=True))
    spec = SandboxSpec(image="busybox", network="allowlist")
    with pytest.raises(SandboxStartFailed, match="simulated"):
        await ctd.create_sandbox("netfail-1", spec)
    assert (await ctd.container_ids(), await ctd.snapshot_keys(active_only=True)) == before
    assert "netfail-1" not in await ctd.task_ids()
    with contextlib.suppress(FileNotFoundError):
        assert "netfail-1" not in os.listdir(ctd.workspace_root)


# -- escape drill: user namespace, disk quota, IO and bandwidth limits --------------

CGROUP = Path("/sys/fs/cgroup")
SETUID_PROBE = r"""
#include <stdio.h>
#include <unistd.h>
int main(void) {
    printf("%d %d\n", (int)getuid(), (int)geteuid());
    return 0;
}
"""


def host_uid(pid: int) -> int:
    """The real uid of ``pid`` as the host sees it."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("Uid:")[1].split()[0])


async def init_pid(ctd: Containerd, box: Sandbox) -> int:
    info = next(i for i in await ctd.list_sandboxes() if i.id == box.id)
    assert info.pid is not None
    return info.pid


@pytest.fixture(scope="module")
async def setuid_image(ctd: Containerd, tmp_path_factory: pytest.TempPathFactory) -> ImageInfo:
    """busybox plus /bin/probe: a static binary, setuid root in the image, printing uid/euid."""
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc (scripts/setup.sh installs it)")
    from sandbox.oci_archive import build_busybox_rootfs, write_oci_archive

    tmp = tmp_path_factory.mktemp("suid")
    rootfs = build_busybox_rootfs(tmp / "rootfs")
    (tmp / "probe.c").write_text(SETUID_PROBE)
    probe = rootfs / "bin" / "probe"
    subprocess.run(["gcc", "-static", "-O1", "-o", str(probe), str(tmp / "probe.c")], check=True)
    os.chmod(probe, 0o4755)
    name = "corral.local/setuid-probe:latest"
    images = await ctd.images.import_archive(write_oci_archive(tmp / "img.tar", [rootfs], name))
    return next(image for image in images if image.name == name)


async def test_root_cannot_read_host_files_left_in_reach(
    ctd: Containerd, make_sandbox: MakeSandbox, neighbour: Sandbox, host_service: HostService
) -> None:
    """A host-root 0600 file left inside a sandbox by mistake (here: dropped into its
    workspace from the host) is closed to the sandbox's root; uid 0 without a user
    namespace (the opt-out) reads it, which is what the user namespace prevents."""
    boxes = {
        userns: await make_sandbox(workspace_mb=8, user_namespace=userns)
        for userns in (True, False)
    }
    for box in boxes.values():
        secret = ctd.workspace_root / box.id / "host-secret"
        secret.write_text("host only\n")
        secret.chmod(0o600)
    mapped = await boxes[True].exec(
        "id -u; stat -c %u /workspace/host-secret; cat /workspace/host-secret; "
        "chmod 644 /workspace/host-secret || echo chmod refused"
    )
    assert mapped.stdout.splitlines()[:2] == ["0", "65534"]  # root, facing an unmapped owner
    assert "host only" not in mapped.stdout and "Permission denied" in mapped.stderr
    assert mapped.stdout.endswith("chmod refused\n")
    opted_out = await boxes[False].exec("cat /workspace/host-secret")
    assert opted_out.stdout == "host only\n"
    # On the host, the sandbox's root is the pool's first unprivileged uid, not 0.
    assert host_uid(await init_pid(ctd, boxes[True])) == ctd.uid_pool.mapping(0).host_id
    assert host_uid(await init_pid(ctd, boxes[False])) == 0
    for box in boxes.values():
        await contained(ctd, box, neighbour, host_service)


async def test_setuid_binary_gives_no_host_privileges(
    ctd: Containerd,
    make_sandbox: MakeSandbox,
    setuid_image: ImageInfo,
    neighbour: Sandbox,
    host_service: HostService,
) -> None:
    box = await make_sandbox(image=setuid_image.name)
    assert (await box.exec("stat -c %a:%u /bin/probe")).stdout == "4755:0\n"  # as in the image
    # no_new_privs: the setuid bit does not raise a user's euid inside the sandbox.
    as_user = await box.exec("/bin/probe", user="1000:1000")
    assert as_user.stdout == "1000 1000\n"
    # And the sandbox's root itself is an unprivileged uid on the host.
    run = asyncio.ensure_future(box.exec("/bin/probe; sleep 30", timeout_s=60))
    try:
        probe_pids: list[int] = []
        for _ in range(100):
            probe_pids = [
                int(p)
                for p in (CGROUP / "pids/corral" / box.id / "cgroup.procs").read_text().split()
                if Path(f"/proc/{p}/comm").read_text().strip() == "sleep"
            ]
            if probe_pids:
                break
            await asyncio.sleep(0.05)
        assert probe_pids and all(host_uid(pid) >= ctd.uid_pool.start for pid in probe_pids)
    finally:
        await box.exec("pkill sleep")
        result = await run
    assert result.stdout.startswith("0 0\n")  # root inside, as the agent expects
    await contained(ctd, box, neighbour, host_service)


async def test_filling_root_hits_the_quota(
    ctd: Containerd, make_sandbox: MakeSandbox, neighbour: Sandbox, host_service: HostService
) -> None:
    filler = await make_sandbox(disk_mb=32)
    fill = await filler.exec("dd if=/dev/zero of=/fill bs=1M count=200", timeout_s=60)
    assert fill.exit_code != 0 and "Disk quota exceeded" in fill.stderr
    # Everything written anywhere on / counts, copy-ups too: another path fails as well.
    more = await filler.exec(
        "cp /bin/busybox /usr/bin/copy && dd if=/dev/zero of=/etc/more bs=1M count=64", timeout_s=60
    )
    assert more.exit_code != 0 and "Disk quota exceeded" in more.stderr
    size = int((await filler.exec("du -sm /fill")).stdout.split()[0])
    assert size <= 32
    # The neighbour (default 1 GiB) writes more than the filler's whole quota.
    wrote = await neighbour.exec("dd if=/dev/zero of=/big bs=1M count=48 && rm /big", timeout_s=60)
    assert wrote.ok, wrote.stderr
    assert (await filler.exec("rm /fill && echo freed > /after")).ok  # room again once freed
    await contained(ctd, filler, neighbour, host_service)


def blkio_file(sandbox_id: str, name: str) -> str:
    return (CGROUP / "blkio/corral" / sandbox_id / f"blkio.throttle.{name}").read_text()


FSYNC_PROBE = (
    "i=0; while [ $i -lt 20 ]; do dd if=/dev/zero of=/probe bs=4k count=1 "
    "conv=fsync 2>/dev/null; i=$((i+1)); done"
)


async def fsync_probe_s(box: Sandbox, samples: int = 5) -> float:
    """Median wall time of 20 small fsync'd writes (one exec per sample)."""
    times = sorted(
        [(await box.exec(FSYNC_PROBE, timeout_s=120)).duration_s for _ in range(samples)]
    )
    return times[len(times) // 2]


async def test_disk_io_hog_is_throttled(
    ctd: Containerd, make_sandbox: MakeSandbox, neighbour: Sandbox, host_service: HostService
) -> None:
    """The limit is what is asserted; the neighbour's fsync latency with and without the
    hog is measured and printed (a ratio on a shared 2-core machine is not a safe gate)."""
    hog = await make_sandbox(io_bps_mb=8, io_iops=400)
    device, limit = blkio_file(hog.id, "write_bps_device").split()
    assert int(limit) == 8 << 20
    assert blkio_file(hog.id, "read_iops_device").split() == [device, "400"]
    idle = await fsync_probe_s(neighbour)
    # Direct writes in a loop: every byte goes to the device, none waits in page cache.
    run = asyncio.ensure_future(
        hog.exec(
            "while :; do dd if=/dev/zero of=/hog bs=1M count=64 oflag=direct 2>/dev/null; done",
            timeout_s=20,
        )
    )
    try:
        busy = await fsync_probe_s(neighbour)
    finally:
        result = await run
    assert result.timed_out  # the hog ran the whole time and was stopped at its timeout
    print(
        f"neighbour fsync probe: idle {idle:.3f}s, with IO hog {busy:.3f}s, "
        f"ratio {busy / idle:.2f} (target <= 2)"
    )
    written = next(
        int(line.split()[2])
        for line in blkio_file(hog.id, "io_service_bytes").splitlines()
        if line.startswith(f"{device} Write")
    )
    # Never more than the limit allows over the hog's lifetime (plus one throttle slice).
    assert 0 < written <= (8 << 20) * (result.duration_s + 1)
    await contained(ctd, hog, neighbour, host_service)


SINK_PORT = 7103
SINK = r"""
import socket, sys, threading, time
def sink(conn):
    total = 0
    while chunk := conn.recv(65536):
        total += len(chunk)
    conn.sendall(b"%d\n" % total); conn.close()
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(8)
print("ready", flush=True)
threading.Thread(target=lambda: [sink(s.accept()[0]) for _ in iter(int, 1)], daemon=True).start()
time.sleep(float(sys.argv[2]))  # bounded lifetime even if the test dies
"""


@pytest.fixture
def sink_ns() -> Iterator[None]:
    if not shutil.which("nft") or not shutil.which("tc"):
        pytest.skip("needs nft and tc")
    argv = [sys.executable, "-c", SINK, str(SINK_PORT), "120"]
    with server_namespace(SRV_NS, SRV_HOST_IF, SRV_HOST_ADDR, SRV_ADDR, argv):
        yield


async def test_bandwidth_hog_stays_within_its_rate(
    ctd: Containerd,
    make_sandbox: MakeSandbox,
    sink_ns: None,
    neighbour: Sandbox,
    host_service: HostService,
) -> None:
    rate_mbit, size = 4, 2_000_000
    hog = await make_sandbox(
        network="allowlist",
        egress_mbit=rate_mbit,
        egress=[{"cidr": f"{SRV_ADDR}/32", "port": SINK_PORT}],
    )
    sent = await hog.exec(f"head -c {size} /dev/zero | nc {SRV_ADDR} {SINK_PORT}", timeout_s=60)
    assert sent.stdout == f"{size}\n", sent.stderr  # the sink got every byte
    achieved = size * 8 / sent.duration_s / 1e6
    print(f"bandwidth hog: {achieved:.2f} Mbit/s against a {rate_mbit} Mbit/s limit")
    # An upper bound: a slow machine only makes it slower. Slack for the bucket's burst.
    assert achieved <= rate_mbit * 1.15
    att = await hog.network_attachment()
    assert att is not None
    in_ns = ["nsenter", f"--net=/proc/{att.pid}/ns/net", "tc", "qdisc", "show", "dev"]
    assert f"rate {rate_mbit}Mbit" in sh(*in_ns, att.sandbox_ifname).stdout
    assert "tbf" not in sh(*in_ns, "lo").stdout  # loopback inside is not shaped
    assert f"rate {rate_mbit}Mbit" in sh("tc", "qdisc", "show", "dev", att.host_ifname).stdout
    await contained(ctd, hog, neighbour, host_service)
