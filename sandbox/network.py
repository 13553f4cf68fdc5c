"""Per-sandbox egress allowlist: a veth pair, a /31 from 198.18.0.0/15, nftables rules.

By default a sandbox has its own network namespace with loopback only, and this
module is not involved. A sandbox that needs to reach something on this machine
(a package proxy, a grader service, a test server) is *attached*:

* a veth pair: host side ``crl<slot>`` in the root netns, sandbox side ``eth0``
  created directly inside ``/proc/<pid>/ns/net`` (never visible on the host);
* a /31 per sandbox (RFC 3021): host side ``198.18.0.0 + 2*slot``, sandbox side
  ``+1``, a default route in the sandbox via the host side. Slots are chosen
  deterministically from a hash of the sandbox id, probed linearly past slots in
  use (allocation table ``<state_dir>/network/attachments.json`` plus a scan of
  the host's interfaces and addresses, so a lost table cannot cause a clash);
  ``198.19.255.0/24`` is never allocated: it is reserved for service namespaces
  on this machine (the integration tests put their servers there);
* nftables, one table ``inet corral`` shared by all sandboxes::

      set sandbox_ifs { type ifname }            every attached host-side veth
      set cut         { type ifname }            quarantined sandboxes
      map egress      { type ifname : verdict }  "crl7" : jump sb7
      chain input   (hook input)   iifname @cut drop; iifname vmap @egress;
                                   iifname "crl*" drop; ip saddr 198.18.0.0/15 ct state new drop
      chain forward (hook forward) iifname/oifname @cut drop;
                                   iifname @sandbox_ifs oifkind != veth drop;
                                   iifname vmap @egress; iifname "crl*" drop;
                                   oifname @sandbox_ifs ct state established,related accept;
                                   oifname "crl*" drop
      chain output  (hook output)  oifname @cut drop
      chain sb7     ip saddr != <sandbox addr> drop; ct direction reply accept;
                    <one accept per EgressRule>; drop

  Dispatch is one hash lookup on the *host-side* interface name (which the
  sandbox cannot forge, unlike its source address), so the cost per packet does
  not grow with the number of sandboxes, and an attach or detach touches only
  that sandbox's chain and set elements. Input and forward share the sandbox's
  chain, so the host's own services (Temporal, containerd, anything bound to
  0.0.0.0) are as unreachable as any other destination unless allowlisted.
  Quarantine (``cut_network``) adds the interface to ``cut``: every packet in or
  out is dropped at the top of each hook, established flows included, while the
  veth, addresses and rules stay so ``restore_network`` is one set deletion.

Nothing is routed off this machine: there is no masquerade/NAT, ``ip_forward``
is never turned on globally (only ``net.ipv4.conf.crl<slot>.forwarding``, which
gates forwarding of packets *received from* that sandbox), and forwarded
sandbox traffic may leave only through another veth, i.e. into a namespace on
this machine. ICMP and IPv6 are not allowlistable (IPv6 is disabled on both veth
ends); DNS is whatever resolver the allowlist names.

Wiring: ``SandboxSpec.network = "allowlist"`` with ``SandboxSpec.egress``.
``Containerd.create_sandbox`` calls ``attach_network(sandbox_id, task_pid,
spec.egress, client.network_state_dir)`` right after the task started (the
netns exists then) and rolls the whole sandbox back if it raises;
``destroy_sandbox`` calls ``detach_network`` before deleting the task;
``Sandbox.cut_network``/``restore_network`` wrap the quarantine calls. All five
are idempotent, so retried activities are safe.

Each nft call is one atomic transaction that first re-asserts the base table
(idempotent commands; see ``render_base_table``), so there is never a window
with half the rules, and no existence probe that grows with the table. Every
mutation runs under one host-wide lock (the nft table and interface names
are host-global, whatever the state dir); errors are ``NetworkError`` with one
line naming the sandbox and the step, after rolling back what that call made.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import ipaddress
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from contract.checks import egress_cidr
from contract.errors import NetworkError
from sandbox.hosttools import run_tool

__all__ = [
    "EgressRule",
    "NetworkAttachment",
    "attach_network",
    "cut_network",
    "detach_network",
    "list_attachments",
    "restore_network",
]

SANDBOX_RANGE = ipaddress.IPv4Network("198.18.0.0/15")
# Never allocated: on-machine service namespaces (tests, proxies) live here.
RESERVED_RANGE = ipaddress.IPv4Network("198.19.255.0/24")
SLOT_COUNT = (SANDBOX_RANGE.num_addresses - RESERVED_RANGE.num_addresses) // 2
TABLE = "corral"
HOST_IF_PREFIX = "crl"
SANDBOX_IFNAME = "eth0"
LOCK_PATH = Path("/run/lock/corral-network.lock")
LOCK_TIMEOUT_S = 30.0
COMMAND_TIMEOUT_S = 15.0
STATE_FILE = "attachments.json"


class EgressRule(BaseModel):
    """One allowed destination: an IPv4 network, a port (None = any) and a protocol."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cidr: str
    # Required even when None: "every port" must be written out, never an omission.
    port: int | None = Field(ge=1, le=65535)
    protocol: Literal["tcp", "udp"] = "tcp"

    @field_validator("cidr")
    @classmethod
    def _valid_cidr(cls, value: str) -> str:
        return egress_cidr(value)


class NetworkAttachment(BaseModel):
    """What attach_network made for one sandbox; persisted in the allocation table."""

    model_config = ConfigDict(extra="forbid")

    sandbox_id: str
    pid: int
    netns_inode: int
    slot: int
    host_ifname: str
    sandbox_ifname: str = SANDBOX_IFNAME
    host_address: str
    sandbox_address: str
    prefixlen: int = 31
    egress: list[EgressRule]
    cut: bool = False
    # tc token-bucket rate of the veth, each direction; None: unshaped.
    rate_mbit: int | None = None

    @property
    def chain(self) -> str:
        return chain_name(self.slot)


# ---------------------------------------------------------------- pure helpers


def slot_addresses(slot: int) -> tuple[str, str]:
    """(host side, sandbox side) addresses of a slot's /31."""
    if not 0 <= slot < SLOT_COUNT:
        raise ValueError(f"slot {slot} outside 0..{SLOT_COUNT - 1}")
    base = int(SANDBOX_RANGE.network_address) + 2 * slot
    return str(ipaddress.IPv4Address(base)), str(ipaddress.IPv4Address(base + 1))


def host_ifname(slot: int) -> str:
    return f"{HOST_IF_PREFIX}{slot}"


def chain_name(slot: int) -> str:
    return f"sb{slot}"


def preferred_slot(sandbox_id: str) -> int:
    digest = hashlib.sha256(sandbox_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") % SLOT_COUNT


def allocate_slot(
    sandbox_id: str, taken_slots: set[int], busy_ifnames: set[str], busy_addresses: set[str]
) -> int:
    """First free slot probing linearly from the id's hash: deterministic, collision-free."""
    start = preferred_slot(sandbox_id)
    for step in range(SLOT_COUNT):
        slot = (start + step) % SLOT_COUNT
        if slot in taken_slots or host_ifname(slot) in busy_ifnames:
            continue
        if busy_addresses.intersection(slot_addresses(slot)):
            continue
        return slot
    raise NetworkError(f"sandbox {sandbox_id}: no free address slot in {SANDBOX_RANGE}")


def render_base_table() -> str:
    """The shared table, as commands that are safe to repeat.

    Every transaction starts with these: sets and the map are only added if
    missing, the base chains are flushed and refilled atomically. So there is
    no "does the table exist" probe (which costs ~160 ms with 3,000 sandboxes),
    and a table someone deleted or edited heals on the next attach or cut.
    """
    t, p = f"inet {TABLE}", HOST_IF_PREFIX
    hook = "type filter hook {} priority filter; policy accept;"
    chains = {
        "input": [
            "iifname @cut drop",
            "iifname vmap @egress",
            f'iifname "{p}*" drop',  # fail closed: a corral veth without a chain
            f"ip saddr {SANDBOX_RANGE} ct state new drop",
        ],
        "forward": [
            "iifname @cut drop",
            "oifname @cut drop",
            'iifname @sandbox_ifs meta oifkind != "veth" drop',  # never off this machine
            "iifname vmap @egress",
            f'iifname "{p}*" drop',
            "oifname @sandbox_ifs ct state established,related accept",
            f'oifname "{p}*" drop',  # nobody opens connections into a sandbox
        ],
        "output": ["oifname @cut drop"],
    }
    lines = [
        f"add table {t}",
        f"add set {t} sandbox_ifs {{ type ifname; }}",
        f"add set {t} cut {{ type ifname; }}",
        f"add map {t} egress {{ type ifname : verdict; }}",
    ]
    for name, rules in chains.items():
        lines.append(f"add chain {t} {name} {{ {hook.format(name)} }}")
        lines.append(f"flush chain {t} {name}")
        lines.extend(f"add rule {t} {name} {rule}" for rule in rules)
    return "\n".join(lines) + "\n"


def _rule_match(rule: EgressRule) -> str:
    if rule.port is None:
        return f"ip daddr {rule.cidr} meta l4proto {rule.protocol}"
    return f"ip daddr {rule.cidr} {rule.protocol} dport {rule.port}"


def render_sandbox_rules(att: NetworkAttachment) -> str:
    """Replace one sandbox's chain and set elements in one atomic transaction."""
    t, ch, ifn = f"inet {TABLE}", att.chain, att.host_ifname
    lines = [
        f"add chain {t} {ch}",
        f"flush chain {t} {ch}",
        # The sandbox is root in its netns and may change its address: pin it.
        f"add rule {t} {ch} ip saddr != {att.sandbox_address} drop",
        # Replies to connections the host opened into the sandbox.
        f"add rule {t} {ch} ct direction reply accept",
        *(f"add rule {t} {ch} {_rule_match(r)} accept" for r in att.egress),
        f"add rule {t} {ch} drop",
        f'add element {t} sandbox_ifs {{ "{ifn}" }}',
        f'add element {t} egress {{ "{ifn}" : jump {ch} }}',
        # add-then-delete makes the delete safe when the element is absent.
        f'add element {t} cut {{ "{ifn}" }}',
    ]
    if not att.cut:
        lines.append(f'delete element {t} cut {{ "{ifn}" }}')
    return "\n".join(lines) + "\n"


def render_sandbox_removal(slot: int) -> str:
    """Remove one sandbox's elements and chain; safe when some are already gone."""
    t, ch, ifn = f"inet {TABLE}", chain_name(slot), host_ifname(slot)
    return (
        "\n".join(
            [
                f"add chain {t} {ch}",
                f'add element {t} egress {{ "{ifn}" : jump {ch} }}',
                f'delete element {t} egress {{ "{ifn}" }}',
                f'add element {t} sandbox_ifs {{ "{ifn}" }}',
                f'delete element {t} sandbox_ifs {{ "{ifn}" }}',
                f'add element {t} cut {{ "{ifn}" }}',
                f'delete element {t} cut {{ "{ifn}" }}',
                f"flush chain {t} {ch}",
                f"delete chain {t} {ch}",
            ]
        )
        + "\n"
    )


def render_cut(slot: int, cut: bool) -> str:
    t, ifn = f"inet {TABLE}", host_ifname(slot)
    lines = [f'add element {t} cut {{ "{ifn}" }}']
    if not cut:
        lines.append(f'delete element {t} cut {{ "{ifn}" }}')
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- allocation table


def _state_path(state_dir: Path) -> Path:
    return state_dir / "network" / STATE_FILE


def load_table(state_dir: Path) -> dict[str, NetworkAttachment]:
    path = _state_path(state_dir)
    if not path.exists():
        return {}
    try:
        raw = json.loads(path.read_text())
        return {k: NetworkAttachment.model_validate(v) for k, v in raw["attachments"].items()}
    except (ValueError, KeyError, TypeError) as exc:
        raise NetworkError(f"allocation table {path} is unreadable: {exc}") from exc


def save_table(state_dir: Path, table: dict[str, NetworkAttachment]) -> None:
    path = _state_path(state_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"version": 1, "attachments": {k: v.model_dump() for k, v in sorted(table.items())}}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body, indent=1))
    os.replace(tmp, path)  # readers (list_attachments) never see a torn file


# ---------------------------------------------------------------- host plumbing


async def _run(
    sandbox_id: str,
    what: str,
    *argv: str,
    stdin: str | None = None,
    ok_stderr: tuple[str, ...] = (),
) -> str:
    """Run a command; raise a one-line NetworkError unless it succeeds (or fails benignly)."""
    return await run_tool(
        f"sandbox {sandbox_id}: {what}",
        *argv,
        error=NetworkError,
        stdin=stdin,
        ok_stderr=ok_stderr,
        timeout_s=COMMAND_TIMEOUT_S,
    )


async def _nft(sandbox_id: str, what: str, script: str) -> None:
    """Apply ``script`` after the base table commands, as one atomic transaction."""
    await _run(sandbox_id, what, "nft", "-f", "-", stdin=render_base_table() + script)


async def _drop_table_if_unused(sandbox_id: str) -> None:
    """Remove the shared table once no sandbox uses it, so a clean host stays clean."""
    out = await _run(
        sandbox_id,
        "list nft set",
        "nft",
        "-j",
        "list",
        "set",
        "inet",
        TABLE,
        "sandbox_ifs",
        ok_stderr=("No such file or directory",),
    )
    if not out.strip():
        return  # no table
    for item in json.loads(out).get("nftables", []):
        if "set" in item and item["set"].get("elem"):
            return
    await _run(sandbox_id, "delete unused nft table", "nft", "delete", "table", "inet", TABLE)


async def _host_interfaces(sandbox_id: str) -> tuple[set[str], set[str]]:
    """(interface names, IPv4 addresses) in the root netns."""
    out = await _run(sandbox_id, "list host addresses", "ip", "-j", "-4", "addr", "show")
    names: set[str] = set()
    addrs: set[str] = set()
    for link in json.loads(out or "[]"):
        names.add(link.get("ifname", ""))
        addrs.update(a["local"] for a in link.get("addr_info", []) if "local" in a)
    out = await _run(sandbox_id, "list host links", "ip", "-j", "link", "show")
    names.update(link.get("ifname", "") for link in json.loads(out or "[]"))
    return names, addrs


async def _link_exists(sandbox_id: str, ifname: str) -> bool:
    out = await _run(sandbox_id, "list host links", "ip", "-j", "link", "show")
    return any(link.get("ifname") == ifname for link in json.loads(out or "[]"))


async def _delete_link(sandbox_id: str, ifname: str) -> None:
    await _run(
        sandbox_id,
        f"delete veth {ifname}",
        "ip",
        "link",
        "del",
        ifname,
        ok_stderr=("Cannot find device",),
    )


def _write_sysctl(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _netns_inode(sandbox_id: str, pid: int) -> int:
    try:
        ino = os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError as exc:
        raise NetworkError(
            f"sandbox {sandbox_id}: no network namespace for pid {pid}: {exc.strerror}"
        ) from exc
    if ino == os.stat("/proc/self/ns/net").st_ino:
        # Configuring "eth0" here would rewire the host itself.
        raise NetworkError(
            f"sandbox {sandbox_id}: pid {pid} is in the host's network "
            "namespace; refusing to attach"
        )
    return ino


async def _create_veth(att: NetworkAttachment) -> None:
    sid, ifn = att.sandbox_id, att.host_ifname
    # The peer is born inside the sandbox netns: it never exists on the host side.
    await _run(
        sid,
        f"create veth {ifn}",
        "ip",
        "link",
        "add",
        ifn,
        "type",
        "veth",
        "peer",
        "name",
        att.sandbox_ifname,
        "netns",
        str(att.pid),
    )
    base = f"/proc/sys/net/ipv6/conf/{ifn}/disable_ipv6"
    if os.path.exists(base):
        _write_sysctl(base, "1")
    # Per-interface forwarding: only packets received from this sandbox may be routed.
    _write_sysctl(f"/proc/sys/net/ipv4/conf/{ifn}/forwarding", "1")
    await _run(
        sid,
        f"configure veth {ifn}",
        "ip",
        "-batch",
        "-",
        stdin=(f"addr add {att.host_address}/{att.prefixlen} dev {ifn}\nlink set {ifn} up\n"),
    )
    ns = f"--net=/proc/{att.pid}/ns/net"
    dev = att.sandbox_ifname
    await _run(
        sid,
        "disable IPv6 in sandbox",
        "nsenter",
        ns,
        "sysctl",
        "-q",
        "-w",
        f"net.ipv6.conf.{dev}.disable_ipv6=1",
        ok_stderr=("No such file",),
    )
    await _run(
        sid,
        f"configure {dev} in sandbox",
        "nsenter",
        ns,
        "ip",
        "-batch",
        "-",
        stdin=(
            "link set lo up\n"
            f"addr add {att.sandbox_address}/{att.prefixlen} dev {dev}\n"
            f"link set {dev} up\n"
            f"route replace default via {att.host_address} dev {dev}\n"
        ),
    )
    if att.rate_mbit is not None:
        await _shape(att)


def tbf_qdisc(dev: str, rate_mbit: int) -> str:
    """A tc batch line: token bucket of ``rate_mbit`` on ``dev``'s egress.

    The burst is 10 ms at that rate (at least 32 KiB so that one TSO segment
    fits), the queue holds 50 ms; only this veth is shaped, never loopback.
    """
    burst = max(32 * 1024, rate_mbit * 1_000_000 // 8 // 100)
    return f"qdisc replace dev {dev} root tbf rate {rate_mbit}mbit burst {burst} latency 50ms\n"


async def _shape(att: NetworkAttachment) -> None:
    """Limit both directions: the sandbox side's egress (what the agent sends, set
    inside its netns, where it has no CAP_NET_ADMIN to undo it) and the host side's
    egress (what it receives)."""
    assert att.rate_mbit is not None
    sid = att.sandbox_id
    await _run(
        sid,
        f"shape {att.host_ifname}",
        "tc",
        "-batch",
        "-",
        stdin=tbf_qdisc(att.host_ifname, att.rate_mbit),
    )
    await _run(
        sid,
        f"shape {att.sandbox_ifname} in sandbox",
        "nsenter",
        f"--net=/proc/{att.pid}/ns/net",
        "tc",
        "-batch",
        "-",
        stdin=tbf_qdisc(att.sandbox_ifname, att.rate_mbit),
    )


async def _teardown(sandbox_id: str, slot: int) -> None:
    """Remove veth (both ends go with it) and nft state; each step tolerates absence."""
    await _delete_link(sandbox_id, host_ifname(slot))
    await _nft(sandbox_id, "remove nft rules", render_sandbox_removal(slot))


@contextlib.asynccontextmanager
async def _host_lock(sandbox_id: str) -> AsyncIterator[None]:
    """Serialise all mutations on this host (the table and ifnames are host-global)."""
    LOCK_PATH.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(LOCK_PATH, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise NetworkError(
                        f"sandbox {sandbox_id}: timed out waiting for {LOCK_PATH}"
                    ) from None
                await asyncio.sleep(0.005)
        yield
    finally:
        os.close(fd)  # closing releases the flock


def _check_id(sandbox_id: str) -> None:
    if not sandbox_id or len(sandbox_id) > 256 or not sandbox_id.isprintable():
        raise NetworkError(f"invalid sandbox id {sandbox_id!r}: want 1-256 printable characters")


# ---------------------------------------------------------------- public API


async def attach_network(
    sandbox_id: str,
    pid: int,
    egress: list[EgressRule],
    state_dir: Path,
    *,
    rate_mbit: int | None = None,
) -> NetworkAttachment:
    """Give the sandbox whose task is ``pid`` a veth and an egress allowlist (idempotent).

    Called again with the same pid it only replaces the rules (the quarantine
    flag is kept); with a new pid (task restarted) it rebuilds the veth in the
    new namespace on the same slot.
    """
    _check_id(sandbox_id)
    egress = [EgressRule.model_validate(r) for r in egress]
    inode = _netns_inode(sandbox_id, pid)
    async with _host_lock(sandbox_id):
        table = load_table(state_dir)
        old = table.get(sandbox_id)
        if (
            old
            and old.pid == pid
            and old.netns_inode == inode
            and await _link_exists(sandbox_id, old.host_ifname)
        ):
            return await _update_rules(state_dir, table, old.model_copy(update={"egress": egress}))
        if old:
            await _teardown(sandbox_id, old.slot)
            slot = old.slot
        else:
            names, addrs = await _host_interfaces(sandbox_id)
            taken = {a.slot for a in table.values()}
            slot = allocate_slot(sandbox_id, taken, names, addrs)
        host_addr, sb_addr = slot_addresses(slot)
        att = NetworkAttachment(
            sandbox_id=sandbox_id,
            pid=pid,
            netns_inode=inode,
            slot=slot,
            host_ifname=host_ifname(slot),
            host_address=host_addr,
            sandbox_address=sb_addr,
            egress=egress,
            cut=old.cut if old else False,
            rate_mbit=rate_mbit,
        )
        await _build(state_dir, table, att)
        return att


async def _update_rules(
    state_dir: Path, table: dict[str, NetworkAttachment], att: NetworkAttachment
) -> NetworkAttachment:
    await _nft(att.sandbox_id, "replace nft rules", render_sandbox_rules(att))
    table[att.sandbox_id] = att
    save_table(state_dir, table)
    return att


async def _build(
    state_dir: Path, table: dict[str, NetworkAttachment], att: NetworkAttachment
) -> None:
    """Rules first, then the link: the veth never carries a packet unfiltered."""
    try:
        await _nft(att.sandbox_id, "install nft rules", render_sandbox_rules(att))
        await _create_veth(att)
        table[att.sandbox_id] = att
        save_table(state_dir, table)
    except BaseException as exc:
        await _rollback(state_dir, table, att, exc)
        raise


async def _rollback(
    state_dir: Path,
    table: dict[str, NetworkAttachment],
    att: NetworkAttachment,
    cause: BaseException,
) -> None:
    try:
        await _teardown(att.sandbox_id, att.slot)
        if table.pop(att.sandbox_id, None) is not None or _state_path(state_dir).exists():
            save_table(state_dir, table)
        await _drop_table_if_unused(att.sandbox_id)
    except (NetworkError, OSError) as exc:
        # Keep the original error; the leftovers are named so someone can clean up.
        cause.add_note(f"rollback of {att.host_ifname} also failed: {exc}")


async def detach_network(sandbox_id: str, state_dir: Path) -> None:
    """Remove the sandbox's veth, rules and allocation; a no-op when not attached."""
    _check_id(sandbox_id)
    async with _host_lock(sandbox_id):
        table = load_table(state_dir)
        att = table.get(sandbox_id)
        if att is None:
            return
        await _teardown(sandbox_id, att.slot)
        del table[sandbox_id]
        save_table(state_dir, table)
        await _drop_table_if_unused(sandbox_id)


async def list_attachments(state_dir: Path) -> list[NetworkAttachment]:
    """Attachments recorded under state_dir, ordered by sandbox id."""
    return [att for _, att in sorted(load_table(state_dir).items())]


async def _set_cut(sandbox_id: str, state_dir: Path, cut: bool) -> NetworkAttachment:
    _check_id(sandbox_id)
    async with _host_lock(sandbox_id):
        table = load_table(state_dir)
        att = table.get(sandbox_id)
        if att is None:
            verb = "cut" if cut else "restore"
            raise NetworkError(f"sandbox {sandbox_id}: cannot {verb} network: not attached")
        await _nft(
            sandbox_id, "cut network" if cut else "restore network", render_cut(att.slot, cut)
        )
        att = att.model_copy(update={"cut": cut})
        table[sandbox_id] = att
        save_table(state_dir, table)
        return att


async def cut_network(sandbox_id: str, state_dir: Path) -> NetworkAttachment:
    """Quarantine: drop every packet to or from the sandbox now; keep veth and rules."""
    return await _set_cut(sandbox_id, state_dir, True)


async def restore_network(sandbox_id: str, state_dir: Path) -> NetworkAttachment:
    """Undo cut_network: the sandbox's allowlist applies again."""
    return await _set_cut(sandbox_id, state_dir, False)
