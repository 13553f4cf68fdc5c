"""The isolated rig: each node of a local stack in its own network namespace.

`corral up --nodes N --isolated` makes the separation of a real fleet on one
machine: the control plane (Temporal, workflow worker, intake) listens on a
bridge address in the root namespace, and every node's processes (containerd,
node worker, sensor) run in a namespace of their own, joined to that bridge by
a veth pair and reaching the control plane only over IP. Nothing is shared
but the network and the kernel (and the filesystem: unix sockets stay
reachable for local CLI tools).

Names derive from the stack's state directory, so two stacks on one machine
(a developer's and the test suite's) never collide:

* bridge ``crb<h6>``, namespace ``corral-<h6>-<node>``, host-side veth
  ``crv<h6><n4>`` (IFNAMSIZ is 16), the node side is ``eth0``;
* addresses from ``100.72.0.0/16`` (shared address space, RFC 6598): one
  /24 per stack picked by the hash and probed past subnets in use; the
  bridge is ``.1``, ``node-K`` is ``.(10+K)``. The sandbox allowlist range
  ``198.18.0.0/15`` (sandbox/network.py) is left alone.

Temporal's dev server cannot listen on the bridge address (its internal
services dial each other on 127.0.0.1), so it stays on loopback and the rig
forwards the bridge address's Temporal port to it: one nftables DNAT rule in
a table of the rig's own (``ip corral_rig_<h6>``) and ``route_localnet`` on
the bridge. The nodes still reach Temporal only over IP.

Processes enter a node's namespace with ``nsenter --net`` rather than
``ip netns exec``: the latter remounts ``/sys`` in a new mount namespace,
which hides the cgroup hierarchies runc needs and the tracefs bpftrace needs.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import subprocess
from dataclasses import dataclass
from pathlib import Path

from contract.errors import CorralError

RIG_RANGE = ipaddress.IPv4Network("100.72.0.0/16")
NETNS_DIR = Path("/run/netns")
FIRST_NODE_HOST = 10


class NetnsError(CorralError):
    """A namespace, bridge or veth of the isolated rig could not be made."""


@dataclass(frozen=True)
class Rig:
    """The names and addresses of one stack's isolated rig."""

    key: str  # 6 hex digits of the state directory's hash

    @classmethod
    def for_state(cls, state: Path) -> Rig:
        return cls(hashlib.sha256(str(state.resolve()).encode()).hexdigest()[:6])

    @property
    def bridge(self) -> str:
        return f"crb{self.key}"

    def netns(self, node: str) -> str:
        return f"corral-{self.key}-{node}"

    def host_veth(self, node: str) -> str:
        return f"crv{self.key}{hashlib.sha256(node.encode()).hexdigest()[:4]}"

    def netns_path(self, node: str) -> Path:
        return NETNS_DIR / self.netns(node)

    def enter(self, node: str, argv: list[str]) -> list[str]:
        """`argv` run inside the node's namespace (same pid: nsenter execs)."""
        return ["nsenter", f"--net={self.netns_path(node)}", "--", *argv]

    # ---------------------------------------------------------- addresses
    def subnet(self) -> ipaddress.IPv4Network:
        """This rig's /24: the bridge's own if it exists, else the first free one."""
        current = _bridge_address(self.bridge)
        if current is not None:
            return current.network
        taken = _host_networks()
        subnets = list(RIG_RANGE.subnets(new_prefix=24))
        start = int(self.key, 16) % len(subnets)
        for offset in range(len(subnets)):
            candidate = subnets[(start + offset) % len(subnets)]
            if not any(candidate.overlaps(net) for net in taken):
                return candidate
        raise NetnsError(f"no free /24 left in {RIG_RANGE} for the isolated rig")

    def host_address(self) -> str:
        return str(self.subnet()[1])

    def node_address(self, node: str) -> str:
        return str(self.subnet()[node_host_number(node)])

    # ------------------------------------------------------------ make/remove
    def ensure_bridge(self) -> str:
        """The bridge with the control plane's address; returns that address."""
        subnet = self.subnet()
        address = f"{subnet[1]}/{subnet.prefixlen}"
        if not _link_exists(self.bridge):
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", address, "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        return str(subnet[1])

    def ensure_node(self, node: str) -> str:
        """The node's namespace, veth and address (idempotent); returns its address."""
        self.ensure_bridge()
        subnet = self.subnet()
        ns, veth = self.netns(node), self.host_veth(node)
        if not self.netns_path(node).exists():
            _ip("netns", "add", ns)
        if not _link_exists(veth):
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", veth, "master", self.bridge, "up")
            address = f"{subnet[node_host_number(node)]}/{subnet.prefixlen}"
            _ip("-n", ns, "addr", "add", address, "dev", "eth0")
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", ns, "link", "set", "eth0", "up")
        return self.node_address(node)

    def remove_node(self, node: str) -> None:
        """Delete the node's namespace; its veth pair goes with it."""
        with contextlib.suppress(NetnsError):
            _ip("link", "del", self.host_veth(node))
        if self.netns_path(node).exists():
            _ip("netns", "del", self.netns(node))

    def nodes(self) -> list[str]:
        """Nodes whose namespace exists (what `down` must remove)."""
        prefix = f"corral-{self.key}-"
        if not NETNS_DIR.exists():
            return []
        return sorted(p.name.removeprefix(prefix) for p in NETNS_DIR.glob(f"{prefix}*"))

    def remove(self) -> None:
        for node in self.nodes():
            self.remove_node(node)
        if _link_exists(self.bridge):
            _ip("link", "del", self.bridge)
        subprocess.run(["nft", "delete", "table", "ip", self.nft_table], capture_output=True)

    # ------------------------------------------------------------ forwarding
    @property
    def nft_table(self) -> str:
        return f"corral_rig_{self.key}"

    def forward_to_loopback(self, ports: list[int]) -> None:
        """Connections to the bridge address on `ports` reach 127.0.0.1 (idempotent)."""
        host = self.ensure_bridge()
        Path(f"/proc/sys/net/ipv4/conf/{self.bridge}/route_localnet").write_text("1")
        rules = "\n".join(
            f'    iifname "{self.bridge}" ip daddr {host} tcp dport {port} dnat to 127.0.0.1:{port}'
            for port in ports
        )
        script = (
            f"table ip {self.nft_table} {{}}\n"
            f"delete table ip {self.nft_table}\n"
            f"table ip {self.nft_table} {{\n"
            "  chain prerouting {\n"
            "    type nat hook prerouting priority dstnat; policy accept;\n"
            f"{rules}\n  }}\n}}\n"
        )
        proc = subprocess.run(["nft", "-f", "-"], input=script, capture_output=True, text=True)
        if proc.returncode != 0:
            raise NetnsError(f"nft: cannot forward {ports} to loopback: {proc.stderr.strip()}")


def node_host_number(node: str) -> int:
    """`node-K` is host K+10 of the /24; other names hash into 100..249."""
    suffix = node.removeprefix("node-")
    if node.startswith("node-") and suffix.isdigit() and int(suffix) < 90:
        return FIRST_NODE_HOST + int(suffix)
    return 100 + int(hashlib.sha256(node.encode()).hexdigest(), 16) % 150


def _ip(*args: str) -> str:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout


def _link_exists(name: str) -> bool:
    return (
        subprocess.run(["ip", "link", "show", name], capture_output=True, check=False).returncode
        == 0
    )


def _bridge_address(bridge: str) -> ipaddress.IPv4Interface | None:
    if not _link_exists(bridge):
        return None
    for line in _ip("-4", "-o", "addr", "show", "dev", bridge).splitlines():
        fields = line.split()
        if "inet" in fields:
            return ipaddress.IPv4Interface(fields[fields.index("inet") + 1])
    return None


def _host_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network on the root namespace's interfaces."""
    networks = []
    for line in _ip("-4", "-o", "addr", "show").splitlines():
        fields = line.split()
        if "inet" in fields:
            networks.append(ipaddress.IPv4Interface(fields[fields.index("inet") + 1]).network)
    return networks
