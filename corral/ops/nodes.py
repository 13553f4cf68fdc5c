"""The fleet's nodes: join this machine, stop or kill its node (`corral node
up|down|kill`), and the registry's view of every node (`list`, `drain`, `forget`).

The first three act on this machine (a node is containerd, a node worker and a
sensor here); the registry's work from any machine that reaches Temporal.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from activities.capacity import headroom
from contract.config import StackConfig
from contract.errors import CorralError
from contract.models import NodeInfo
from workers.stack import Stack, StackStatus
from workers.temporal import connect
from workflows import nodes as registry

Say = Callable[[str], None]

# After the drain signal, placements the workflow workers made from their
# cached registry (refreshed every second) may still land: wait that out.
DRAIN_SETTLE_S = 3.0
DRAIN_POLL_S = 2.0


class UnknownNode(CorralError):
    """The node registry does not know the node named."""


async def join_node(
    config: StackConfig,
    name: str,
    *,
    temporal: str | None = None,
    intake_url: str | None = None,
    progress: Say | None = None,
) -> StackStatus:
    """Start node `name` here (containerd, node worker, sensor); it undrains and joins.

    `temporal` (HOST:PORT) and `intake_url` point a node on another host at the
    control plane. Returns this machine's stack status.
    """
    return await Stack(config).node_up(
        name, progress=progress, temporal=temporal, intake_url=intake_url
    )


async def stop_node(
    config: StackConfig,
    name: str,
    *,
    now: bool = False,
    timeout_s: float = 3600.0,
    say: Say | None = None,
    warn: Say | None = None,
) -> list[str]:
    """Drain this machine's node `name`, wait up to `timeout_s` for its episodes,
    then stop it and remove its sandboxes; `now` stops it at once (its running
    episodes fail: node lost). Returns the names of the processes stopped.
    `say` is told while episodes still run, `warn` if some still do at the timeout."""
    stack = Stack(config)
    stack.check_local_node(name)
    if not now:
        await drain_and_wait(config, name, timeout_s=timeout_s, say=say, warn=warn)
    return await stack.node_down(name)


async def drain_and_wait(
    config: StackConfig,
    name: str,
    *,
    timeout_s: float,
    say: Say | None = None,
    warn: Say | None = None,
) -> int:
    """Drain `name` and wait until no episode runs on it, `timeout_s` at most;
    the episodes still running then (0 for a node that never joined)."""
    tell = say or (lambda _msg: None)
    client = await connect(config)
    try:
        await registry.drain_node(client, name, by="corral node down")
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            raise
        return 0  # its registry shard never started: the node never joined, nothing runs there
    await asyncio.sleep(DRAIN_SETTLE_S)
    deadline = time.monotonic() + timeout_s
    while (running := await registry.episodes_on(client, name)) and time.monotonic() < deadline:
        tell(f"{name} is draining: {running} episodes still running…")
        await asyncio.sleep(DRAIN_POLL_S)
    if running and warn is not None:
        warn(f"{running} episodes still on {name} after {timeout_s:.0f} s")
    return running


async def kill_node(config: StackConfig, name: str) -> list[int]:
    """SIGKILL every process of this machine's node `name` at once, as a crash would
    (drills, tests); the pids killed, none if it was not running."""
    return await Stack(config).node_kill(name)


async def list_nodes(config: StackConfig) -> list[NodeInfo]:
    """Every node the registry knows, with its last heartbeat and state
    (ready, draining, lost)."""
    return await registry.list_nodes(await connect(config))


def node_headroom(info: NodeInfo) -> str:
    """How many more sandboxes the node has room for, and what limits it."""
    return headroom(info.heartbeat.capacity, info.heartbeat.use)


async def drain_node(config: StackConfig, name: str, *, by: str = "corral node drain") -> None:
    """No new episodes on `name`; running ones finish (`join_node` undrains).
    Raises `UnknownNode` unless the registry knows it."""
    client = await connect(config)
    await _known_node(client, name)
    await registry.drain_node(client, name, by=by)


async def forget_node(config: StackConfig, name: str, *, by: str = "corral node forget") -> None:
    """Remove `name` from the registry now (a lost node leaves by itself after
    10 minutes; one that heartbeats again is listed again). Raises `UnknownNode`
    unless the registry knows it."""
    client = await connect(config)
    await _known_node(client, name)
    await registry.forget_node(client, name, by=by)


async def _known_node(client: Client, name: str) -> None:
    known = {info.name for info in await registry.list_nodes(client)}
    if name not in known:
        raise UnknownNode(
            f"unknown node {name!r}: the registry knows {', '.join(sorted(known)) or 'no nodes'}"
        )
