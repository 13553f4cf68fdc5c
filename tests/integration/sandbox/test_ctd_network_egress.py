"""Egress allowlist on real veths and nftables, without containerd.

A "sandbox" is ``unshare --net sleep``; the allowed servers run in a network
namespace this test makes (``corral-test-srv``, 198.19.255.0/31, the range
network.py never allocates) and on the host side of the sandbox's veth. Every
probe targets those addresses or loopback, with a short timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from netns_server import server_namespace, sh

from contract.errors import NetworkError
from sandbox.network import (
    TABLE,
    EgressRule,
    attach_network,
    cut_network,
    detach_network,
    list_attachments,
    restore_network,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("nft") or not shutil.which("ip"),
        reason="needs root, nft and ip",
    ),
]

SRV_NS = "corral-test-srv"
SRV_HOST_IF = "crtsrv"
SRV_HOST_ADDR = "198.19.255.0"
SRV_ADDR = "198.19.255.1"
ALLOWED_TCP, DENIED_TCP, ALLOWED_UDP = 7001, 7002, 7005

SERVER = r"""
import socket, sys, threading, time
def tcp(port):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(16)
    while True:
        c, _ = s.accept(); c.sendall(b"hello\n"); c.close()
def udp(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", port))
    while True:
        data, peer = s.recvfrom(64); s.sendto(data, peer)
for p in sys.argv[1].split(","):
    threading.Thread(target=tcp, args=(int(p),), daemon=True).start()
threading.Thread(target=udp, args=(int(sys.argv[2]),), daemon=True).start()
print("ready", flush=True)
time.sleep(float(sys.argv[3]))  # bounded lifetime even if the test dies
"""

PROBE = r"""
import socket, sys
host, port, proto = sys.argv[1], int(sys.argv[2]), sys.argv[3]
try:
    if proto == "tcp":
        s = socket.create_connection((host, port), timeout=0.6)
        ok = s.recv(6) == b"hello\n"
    else:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(0.6)
        s.sendto(b"ping", (host, port)); ok = s.recvfrom(64)[0] == b"ping"
except OSError:
    ok = False
print("open" if ok else "closed")
"""


def probe(pid: int, host: str, port: int, proto: str = "tcp") -> bool:
    out = sh(
        "nsenter", f"--net=/proc/{pid}/ns/net", sys.executable, "-c", PROBE, host, str(port), proto
    )
    return out.stdout.strip() == "open"


def start_sandbox() -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(["unshare", "--net", "sleep", "120"])
    ours = os.stat("/proc/self/ns/net").st_ino
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # unshare execs sleep once the netns exists
        with contextlib.suppress(OSError):
            if os.stat(f"/proc/{proc.pid}/ns/net").st_ino != ours:
                return proc
        time.sleep(0.01)
    proc.kill()
    raise RuntimeError("unshare --net did not make a namespace")


def stop(proc: subprocess.Popen[bytes] | subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait(timeout=5)


def host_links() -> set[str]:
    return {link["ifname"] for link in json.loads(sh("ip", "-j", "link", "show").stdout)}


def table_exists() -> bool:
    return sh("nft", "list", "table", "inet", TABLE, check=False).returncode == 0


def sandbox_links(pid: int) -> set[str]:
    out = sh("nsenter", f"--net=/proc/{pid}/ns/net", "ip", "-j", "link", "show").stdout
    return {link["ifname"] for link in json.loads(out)}


@pytest.fixture
def server_ns() -> Iterator[None]:
    """Servers in their own netns, reachable from the host via one veth."""
    argv = [sys.executable, "-c", SERVER, f"{ALLOWED_TCP},{DENIED_TCP}", str(ALLOWED_UDP), "120"]
    with server_namespace(SRV_NS, SRV_HOST_IF, SRV_HOST_ADDR, SRV_ADDR, argv):
        yield


@contextlib.asynccontextmanager
async def host_server() -> AsyncIterator[tuple[int, int]]:
    """Two TCP services in the root netns bound to 0.0.0.0 (think: Temporal, containerd)."""

    async def greet(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"hello\n")
        await w.drain()
        w.close()

    a = await asyncio.start_server(greet, "0.0.0.0", 0)
    b = await asyncio.start_server(greet, "0.0.0.0", 0)
    try:
        yield a.sockets[0].getsockname()[1], b.sockets[0].getsockname()[1]
    finally:
        a.close()
        b.close()


async def aprobe(pid: int, host: str, port: int, proto: str = "tcp") -> bool:
    # The host servers live on this event loop: keep it running while probing.
    return await asyncio.to_thread(probe, pid, host, port, proto)


async def test_allowlist_cut_restore_detach(server_ns: None, tmp_path: Path) -> None:
    sandbox = start_sandbox()
    sid = "episode-net-1"
    forward_before = Path("/proc/sys/net/ipv4/ip_forward").read_text()
    try:
        assert sandbox_links(sandbox.pid) == {"lo"}  # loopback only until attached
        rules = [
            EgressRule(cidr=f"{SRV_ADDR}/32", port=ALLOWED_TCP),
            EgressRule(cidr=f"{SRV_ADDR}/32", port=ALLOWED_UDP, protocol="udp"),
        ]
        async with host_server() as (denied_host_port, allowed_host_port):
            t0 = time.perf_counter()
            att = await attach_network(sid, sandbox.pid, rules, tmp_path)
            print(f"attach took {(time.perf_counter() - t0) * 1000:.1f} ms")
            assert sandbox_links(sandbox.pid) == {"lo", "eth0"}
            assert await aprobe(sandbox.pid, SRV_ADDR, ALLOWED_TCP)
            assert await aprobe(sandbox.pid, SRV_ADDR, ALLOWED_UDP, "udp")
            assert not await aprobe(sandbox.pid, SRV_ADDR, DENIED_TCP)
            assert not await aprobe(sandbox.pid, SRV_ADDR, ALLOWED_TCP, "udp")
            assert not await aprobe(sandbox.pid, att.host_address, denied_host_port)
            assert not await aprobe(sandbox.pid, att.host_address, allowed_host_port)
            assert not await aprobe(sandbox.pid, SRV_HOST_ADDR, denied_host_port)
            assert not await aprobe(sandbox.pid, "127.0.0.1", denied_host_port)

            # Idempotent: same call, same slot; a wider allowlist replaces the rules.
            assert await attach_network(sid, sandbox.pid, rules, tmp_path) == att
            wider = [*rules, EgressRule(cidr=f"{att.host_address}/32", port=allowed_host_port)]
            att2 = await attach_network(sid, sandbox.pid, wider, tmp_path)
            assert att2.slot == att.slot and att2.egress == wider
            assert await aprobe(sandbox.pid, att.host_address, allowed_host_port)
            assert not await aprobe(sandbox.pid, att.host_address, denied_host_port)

            cut = await cut_network(sid, tmp_path)
            assert cut.cut and (await list_attachments(tmp_path))[0].cut
            assert not await aprobe(sandbox.pid, SRV_ADDR, ALLOWED_TCP)
            assert not await aprobe(sandbox.pid, att.host_address, allowed_host_port)
            assert att.host_ifname in host_links()  # kept for forensics and restore
            # Re-attaching (a retried activity) must not lift the quarantine.
            assert (await attach_network(sid, sandbox.pid, wider, tmp_path)).cut
            assert not await aprobe(sandbox.pid, SRV_ADDR, ALLOWED_TCP)

            assert not (await restore_network(sid, tmp_path)).cut
            assert await aprobe(sandbox.pid, SRV_ADDR, ALLOWED_TCP)
            assert await aprobe(sandbox.pid, att.host_address, allowed_host_port)

        await detach_network(sid, tmp_path)
        await detach_network(sid, tmp_path)  # idempotent
        assert att.host_ifname not in host_links()
        assert sandbox_links(sandbox.pid) == {"lo"}
        assert not table_exists()
        assert await list_attachments(tmp_path) == []
        assert Path("/proc/sys/net/ipv4/ip_forward").read_text() == forward_before
    finally:
        with contextlib.suppress(NetworkError):
            await detach_network(sid, tmp_path)
        stop(sandbox)


async def test_refuses_host_netns_and_unknown_cut(tmp_path: Path) -> None:
    with pytest.raises(NetworkError, match="host's network namespace"):
        await attach_network("episode-host", os.getpid(), [], tmp_path)
    with pytest.raises(NetworkError, match="no network namespace"):
        await attach_network("episode-gone", 2**22 + 1, [], tmp_path)
    with pytest.raises(NetworkError, match="not attached"):
        await cut_network("episode-none", tmp_path)
    await detach_network("episode-none", tmp_path)  # no-op
    assert await list_attachments(tmp_path) == []


async def test_failed_attach_rolls_back(tmp_path: Path) -> None:
    sandbox = start_sandbox()
    sid = "episode-rollback"
    try:
        # An eth0 already in the sandbox netns makes the veth peer creation fail.
        sh(
            "nsenter",
            f"--net=/proc/{sandbox.pid}/ns/net",
            "ip",
            "link",
            "add",
            "eth0",
            "type",
            "veth",
            "peer",
            "name",
            "eth1",
        )
        before = host_links()
        with pytest.raises(NetworkError, match=f"sandbox {sid}: create veth crl"):
            await attach_network(sid, sandbox.pid, [], tmp_path)
        assert host_links() == before
        assert not table_exists()
        assert await list_attachments(tmp_path) == []
    finally:
        with contextlib.suppress(NetworkError):
            await detach_network(sid, tmp_path)
        stop(sandbox)


async def test_many_sandboxes_distinct_slots(tmp_path: Path) -> None:
    n = 20
    sandboxes = [start_sandbox() for _ in range(n)]
    ids = [f"episode-many-{i}" for i in range(n)]
    try:
        t0 = time.perf_counter()
        atts = await asyncio.gather(
            *(
                attach_network(
                    sid, sb.pid, [EgressRule(cidr=f"{SRV_ADDR}/32", port=ALLOWED_TCP)], tmp_path
                )
                for sid, sb in zip(ids, sandboxes, strict=True)
            )
        )
        dt = time.perf_counter() - t0
        print(f"{n} concurrent attaches: {dt * 1000:.0f} ms ({dt / n * 1000:.1f} ms each)")
        assert len({a.slot for a in atts}) == n
        assert len({a.sandbox_address for a in atts}) == n
        assert {a.sandbox_id for a in await list_attachments(tmp_path)} == set(ids)
        # One sandbox may not reach a server in another one (not allowlisted).
        peer = subprocess.Popen(
            [
                "nsenter",
                f"--net=/proc/{sandboxes[1].pid}/ns/net",
                sys.executable,
                "-c",
                SERVER,
                str(ALLOWED_TCP),
                str(ALLOWED_UDP),
                "60",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert peer.stdout is not None and peer.stdout.readline().strip() == "ready"
            assert await aprobe(sandboxes[1].pid, "127.0.0.1", ALLOWED_TCP)  # it is listening
            assert not await aprobe(sandboxes[0].pid, atts[1].sandbox_address, ALLOWED_TCP)
        finally:
            stop(peer)
        t0 = time.perf_counter()
        await asyncio.gather(*(detach_network(sid, tmp_path) for sid in ids))
        print(f"{n} concurrent detaches: {(time.perf_counter() - t0) * 1000:.0f} ms")
        assert not any(a.host_ifname in host_links() for a in atts)
        assert not table_exists()
    finally:
        for sid in ids:
            with contextlib.suppress(NetworkError):
                await detach_network(sid, tmp_path)
        for sb in sandboxes:
            stop(sb)
