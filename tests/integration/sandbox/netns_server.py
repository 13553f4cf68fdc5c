"""A test server in a network namespace of its own, reachable over one veth.

The allowlist tests need a destination that is on this machine but not the
host's own stack: a netns at 198.19.255.x (never allocated to sandboxes),
routed back to 198.18.0.0/15 through the host side of its veth.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=20, check=check)


@contextlib.contextmanager
def server_namespace(
    ns: str, host_if: str, host_addr: str, addr: str, server_argv: list[str]
) -> Iterator[subprocess.Popen[str]]:
    """Run `server_argv` inside netns `ns` at `addr`; it must print "ready" first."""
    sh("ip", "netns", "del", ns, check=False)
    sh("ip", "link", "del", host_if, check=False)
    server: subprocess.Popen[str] | None = None
    try:
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", "srv0", "netns", ns)
        sh("ip", "addr", "add", f"{host_addr}/31", "dev", host_if)
        sh("ip", "link", "set", host_if, "up")
        # Replies to sandboxes are forwarded by the host: per-interface, never ip_forward.
        Path(f"/proc/sys/net/ipv4/conf/{host_if}/forwarding").write_text("1")
        in_ns = ("ip", "-n", ns)
        sh(*in_ns, "addr", "add", f"{addr}/31", "dev", "srv0")
        sh(*in_ns, "link", "set", "srv0", "up")
        sh(*in_ns, "link", "set", "lo", "up")
        sh(*in_ns, "route", "add", "198.18.0.0/15", "via", host_addr)
        server = subprocess.Popen(
            ["ip", "netns", "exec", ns, *server_argv], stdout=subprocess.PIPE, text=True
        )
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        yield server
    finally:
        if server is not None:
            server.kill()
            server.wait(timeout=5)
        sh("ip", "link", "del", host_if, check=False)
        sh("ip", "netns", "del", ns, check=False)
