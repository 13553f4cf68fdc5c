"""The node registry: which nodes exist, what they hold, and which are lost.

Nodes on any host join through Temporal alone: each node worker signals its
heartbeat (`NodeHeartbeat`) to a long-running `NodeRegistryWorkflow` when
what placement reads of it changed, signal-with-start, so the first node to
come up creates it. The registry is `REGISTRY_SHARDS` such workflows, a
node's shard fixed by a hash of its name (docs/benchmarks.md, "corral sim").
Placement reads the registry (through the workflow worker's cached copy, see
`activities/placement.py`); on-call drains nodes through it.

Liveness is not a signal: on a node's first beat its shard starts a presence
activity on the node's own queue (`activities/presence.py`), which the node
heartbeats until cancelled. Activity heartbeats write no history event and
wake no workflow; when the node dies the server's heartbeat timeout (or the
schedule-to-start timeout, for a node that never picked it up) fails the
activity and the node is lost at once. A node worker that stops says so
(`NodeStopping`): it is lost `LOST_AFTER_S` later unless a worker of it beats
again (a restart). A continue-as-new abandons the old run's presence
activities; the new run arms them again for every node not lost.

A lost node's episodes are told (`node_lost` signal, found by the
`SandboxNode` search attribute) so that none hangs. When a lost node beats
again it is ready again; its node worker reaps its leftovers before it polls
for work. A node lost for `FORGET_LOST_AFTER_S` leaves the registry; `forget`
removes one at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel
from temporalio import workflow
from temporalio.client import Client, WorkflowHandle
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, TimeoutType
from temporalio.exceptions import TimeoutError as ActivityTimeout
from temporalio.service import RPCError

with workflow.unsafe.imports_passed_through():
    from contract.models import NodeHeartbeat, NodeInfo, NodeLostInput, NodeRef

REGISTRY_WORKFLOW_ID = "corral-node-registry"  # shard 0 keeps the single registry's id
# Every node, CLI and workflow worker must agree on this number (it is code, not
# config, for that reason). 32 keeps a shard under 10 signals a second up to
# 1,600 nodes beating every 5 s.
REGISTRY_SHARDS = 32
HEARTBEAT_EVERY_S = 5.0  # a node looks this often whether it has news to send
# A node whose presence activity is not running (not armed yet, or its registry
# lost track) signals this often anyway (the keep-alive); placement skips a node
# whose presence ended (activities/placement.py).
KEEPALIVE_EVERY_S = 10.0
# A node not present and silent this long is lost (checked every CHECK_EVERY_S);
# a present node is lost when its presence activity's heartbeats stop for as long.
LOST_AFTER_S = 25.0
# The presence activity's heartbeat timeout, and how long it may wait for the
# node to pick it up. Node workers send a heartbeat every 12.5 s
# (activities/presence.py): 1,000 nodes make 80 heartbeat calls a second, none
# of them a history event.
PRESENCE_TIMEOUT_S = LOST_AFTER_S
# Presence runs until cancelled; this only bounds a forgotten one. One that ends
# this way is armed again, not counted as a loss.
PRESENCE_MAX_S = 30 * 24 * 3600.0
PRESENCE_PATCH = "presence-activity"  # registries recorded before presence replay without it
CHECK_EVERY_S = 5.0
IDLE_CHECK_EVERY_S = 60.0  # every node present: only continue-as-new is looked at
RETELL_LOST_EVERY_S = 30.0
# A node lost this long is dropped from the registry (`corral node list`).
FORGET_LOST_AFTER_S = 600.0
# Hand over to a new run long before the history grows large (a signal per node
# every few seconds adds up).
MAX_SIGNALS_PER_RUN = 2000


class RegistryState(BaseModel):
    nodes: dict[str, NodeInfo] = {}
    # Drains asked for before the node's first heartbeat, or while it is lost.
    drained: list[str] = []


@workflow.defn
class NodeRegistryWorkflow:
    @workflow.init
    def __init__(self, state: RegistryState | None = None) -> None:
        self._s = state or RegistryState()
        self._signals = 0
        self._lost_queue: list[str] = []
        self._told: dict[str, datetime] = {}  # when each lost node's episodes were told
        self._presence: dict[str, _Armed] = {}  # this run's presence activity per node

    @workflow.run
    async def run(self, state: RegistryState | None = None) -> None:
        if workflow.patched(PRESENCE_PATCH):
            # The last run's presence activities were abandoned with it.
            for info in self._s.nodes.values():
                if info.state != "lost" and info.name not in self._presence:
                    self._arm(info)
        while self._signals < MAX_SIGNALS_PER_RUN and not _suggested():
            await self._wait()
            self._mark_lost()
            while self._lost_queue:
                await self._tell_episodes(self._lost_queue.pop(0))
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(self._s)

    async def _wait(self) -> None:
        """Until a lost node is to be told, or the next check. With every node
        present nothing is checked by the clock (a presence timeout wakes the
        loop): a workflow task a minute, not every 5 s per shard."""
        if self._needs_clock():
            wake, every = (lambda: bool(self._lost_queue)), CHECK_EVERY_S
        else:
            wake, every = self._idle_wake, IDLE_CHECK_EVERY_S
        with contextlib.suppress(TimeoutError):
            await workflow.wait_condition(wake, timeout=timedelta(seconds=every))

    def _mark_lost(self) -> None:
        now = workflow.now()
        for name in [n for n, info in self._s.nodes.items() if _expired(info, now)]:
            workflow.logger.info("node %s forgotten: lost for %.0f s", name, FORGET_LOST_AFTER_S)
            self._forget(name)
        for info in self._s.nodes.values():
            silent = (now - info.last_seen).total_seconds()
            if info.state != "lost" and not info.present and silent > LOST_AFTER_S:
                info.state = "lost"
                workflow.logger.warning("node %s lost: silent for %.0f s", info.name, silent)
            if info.state == "lost" and self._tell_due(info.name, now):
                # Told again while it stays lost: an episode that visibility did
                # not list yet the first time must not wait on the dead node.
                self._told[info.name] = now
                self._lost_queue.append(info.name)
        for name in [n for n in self._told if self._s.nodes[n].state != "lost"]:
            del self._told[name]

    def _idle_wake(self) -> bool:
        """The clock is needed again, or it is time to continue as new."""
        full = self._signals >= MAX_SIGNALS_PER_RUN
        return bool(self._lost_queue) or self._needs_clock() or full

    def _needs_clock(self) -> bool:
        """A node not present: the silence rule, a lost node's retelling and expiry."""
        return any(not info.present for info in self._s.nodes.values())

    def _tell_due(self, node: str, now: datetime) -> bool:
        told = self._told.get(node)
        return told is None or (now - told).total_seconds() >= RETELL_LOST_EVERY_S

    async def _tell_episodes(self, node: str) -> None:
        await workflow.execute_activity(
            "corral.node_lost",
            NodeLostInput(node=node, reason=f"node lost: {node}"),
            start_to_close_timeout=timedelta(seconds=60),
            retry_policy=RetryPolicy(maximum_attempts=5),
        )

    # ------------------------------------------------------------ presence
    def _arm(self, info: NodeInfo) -> None:
        """Start the node's presence activity, cancelling one armed before (a
        restarted worker's predecessor: its timeout must not lose the node)."""
        old = self._presence.pop(info.name, None)
        if old is not None:
            old.handle.cancel()
        handle = workflow.start_activity(
            "corral.presence",
            NodeRef(name=info.name),
            task_queue=info.heartbeat.task_queue,
            schedule_to_start_timeout=timedelta(seconds=PRESENCE_TIMEOUT_S),
            heartbeat_timeout=timedelta(seconds=PRESENCE_TIMEOUT_S),
            start_to_close_timeout=timedelta(seconds=PRESENCE_MAX_S),
            retry_policy=RetryPolicy(maximum_attempts=1),
        )
        armed = _Armed(boot=info.heartbeat.boot, handle=handle)
        self._presence[info.name] = armed
        info.present = True
        armed.watch = asyncio.create_task(self._watch(info.name, armed))

    async def _watch(self, name: str, armed: _Armed) -> None:
        silent = False
        try:
            await armed.handle
        except asyncio.CancelledError:
            return  # cancelled here: armed again or forgotten
        except ActivityError as err:
            silent = _timed_out(err)
        if self._presence.get(name) is not armed:
            return  # superseded while it ended
        del self._presence[name]
        info = self._s.nodes.get(name)
        if info is None:
            return
        info.present = False
        now = workflow.now()
        if not silent:
            # Its worker stopped (or presence ran out): lost by the silence rule
            # unless a worker of it beats again.
            info.last_seen = now
            return
        # Its last heartbeat was PRESENCE_TIMEOUT_S ago; that is when it was last
        # seen (and where the lost node's 10 minutes in the list start).
        info.last_seen = max(info.last_seen, now - timedelta(seconds=PRESENCE_TIMEOUT_S))
        if info.state != "lost":
            info.state = "lost"
            workflow.logger.warning("node %s lost: its presence timed out", name)
            self._told[name] = now
            self._lost_queue.append(name)

    @workflow.signal
    def heartbeat(self, beat: NodeHeartbeat) -> None:
        self._signals += 1
        now = workflow.now()
        known = self._s.nodes.get(beat.name)
        draining = beat.name in self._s.drained or (known is not None and known.draining)
        info = NodeInfo(
            heartbeat=beat,
            state="draining" if draining else "ready",
            draining=draining,
            last_seen=now,
            joined=known.joined if known is not None and known.state != "lost" else now,
            present=known.present if known is not None else None,
        )
        self._s.nodes[beat.name] = info
        armed = self._presence.get(beat.name)
        if (armed is None or armed.boot != beat.boot) and workflow.patched(PRESENCE_PATCH):
            self._arm(info)

    @workflow.signal
    def drain(self, node: NodeRef) -> None:
        self._signals += 1
        self._set_draining(node.name, True)

    @workflow.signal
    def undrain(self, node: NodeRef) -> None:
        self._signals += 1
        self._set_draining(node.name, False)

    @workflow.signal
    def forget(self, node: NodeRef) -> None:
        """Drop a node now (decommissioned, renamed); it rejoins if it beats again."""
        self._signals += 1
        self._forget(node.name)

    def _forget(self, name: str) -> None:
        self._s.nodes.pop(name, None)
        self._told.pop(name, None)
        armed = self._presence.pop(name, None)
        if armed is not None:
            armed.handle.cancel()  # a live node beats again (keep-alive) and rejoins
        if name in self._s.drained:
            self._s.drained.remove(name)
        # A lost-node fan-out already queued still runs: its episodes must hear.

    def _set_draining(self, name: str, draining: bool) -> None:
        if draining and name not in self._s.drained:
            self._s.drained.append(name)
        if not draining and name in self._s.drained:
            self._s.drained.remove(name)
        info = self._s.nodes.get(name)
        if info is not None:
            info.draining = draining
            if info.state != "lost":
                info.state = "draining" if draining else "ready"

    @workflow.query
    def nodes(self) -> list[NodeInfo]:
        return sorted(self._s.nodes.values(), key=lambda info: info.name)


@dataclass
class _Armed:
    boot: str  # the node worker it was armed for
    handle: workflow.ActivityHandle[Any]
    watch: asyncio.Task[None] | None = None  # held here so that it is not collected


def _timed_out(err: ActivityError) -> bool:
    """The node went quiet (heartbeats stopped, or it never picked presence up),
    as opposed to its worker saying it stops or presence running its course."""
    cause = err.cause
    return isinstance(cause, ActivityTimeout) and cause.type in (
        TimeoutType.HEARTBEAT,
        TimeoutType.SCHEDULE_TO_START,
    )


def _suggested() -> bool:
    return workflow.info().is_continue_as_new_suggested()


def _expired(info: NodeInfo, now: datetime) -> bool:
    return info.state == "lost" and (now - info.last_seen).total_seconds() > FORGET_LOST_AFTER_S


# ---------------------------------------------------------------- client side
def shard_of(node: str) -> int:
    """The node's registry shard: a stable hash (crc32), the same on every host."""
    return zlib.crc32(node.encode()) % REGISTRY_SHARDS


def registry_id(shard: int) -> str:
    return REGISTRY_WORKFLOW_ID if shard == 0 else f"{REGISTRY_WORKFLOW_ID}-{shard:02d}"


def registry_handle(client: Client, shard: int = 0) -> WorkflowHandle[NodeRegistryWorkflow, None]:
    return client.get_workflow_handle_for(NodeRegistryWorkflow.run, registry_id(shard))


def node_registry(client: Client, node: str) -> WorkflowHandle[NodeRegistryWorkflow, None]:
    return registry_handle(client, shard_of(node))


@dataclass
class BeatGate:
    """Whether a node's beat is worth a signal: sent when what placement reads
    changed (sandboxes, admission, images, warm sandboxes), else only as the
    keep-alive, and that only while the node's presence activity is not
    running (`present`): an idle fleet whose presence is armed sends none."""

    _sent: tuple[object, ...] | None = None
    _sent_at: float = -KEEPALIVE_EVERY_S

    def due(self, beat: NodeHeartbeat, now: float, present: bool = False) -> bool:
        # Beats are looked at every HEARTBEAT_EVERY_S: the keep-alive is due on
        # the tick that lands about KEEPALIVE_EVERY_S after the last send, not
        # one tick later (which would leave placement's 15 s silence too close).
        keepalive = KEEPALIVE_EVERY_S - HEARTBEAT_EVERY_S / 2
        if _news(beat) != self._sent:
            return True
        return not present and now - self._sent_at >= keepalive

    def sent(self, beat: NodeHeartbeat, now: float) -> None:
        self._sent, self._sent_at = _news(beat), now


def _news(beat: NodeHeartbeat) -> tuple[object, ...]:
    use = beat.use
    return (
        beat.task_queue,
        beat.version,
        beat.capacity,
        use.sandboxes,
        use.admitting,
        use.closed,
        tuple(beat.images),
        tuple(sorted(beat.warm.items())),
    )


async def send_heartbeat(client: Client, task_queue: str, beat: NodeHeartbeat) -> None:
    """Signal-with-start of the node's shard: the first node up creates it."""
    await client.start_workflow(
        NodeRegistryWorkflow.run,
        None,
        id=registry_id(shard_of(beat.name)),
        task_queue=task_queue,
        start_signal="heartbeat",
        start_signal_args=[beat],
    )


async def list_nodes(client: Client) -> list[NodeInfo]:
    """Every shard's view, merged and sorted; empty when no node has ever joined."""
    shards = await asyncio.gather(*(shard_nodes(client, k) for k in range(REGISTRY_SHARDS)))
    return merge_shards(shards)


def merge_shards(shards: list[list[NodeInfo]]) -> list[NodeInfo]:
    newest: dict[str, NodeInfo] = {}
    for info in (info for shard in shards for info in shard):
        # A node seen by two shards (the single registry of before, kept as
        # shard 0) is what its newest heartbeat says.
        if info.name not in newest or info.last_seen > newest[info.name].last_seen:
            newest[info.name] = info
    return sorted(newest.values(), key=lambda info: info.name)


async def shard_nodes(client: Client, shard: int) -> list[NodeInfo]:
    """One shard's nodes; empty when no node hashed to it has joined."""
    from temporalio.service import RPCStatusCode

    try:
        return await registry_handle(client, shard).query(NodeRegistryWorkflow.nodes)
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return []
        raise


async def running_shards(client: Client) -> set[int]:
    """The shards whose registry workflow runs: one visibility query, where
    asking each shard would cost a failed query per shard no node has joined."""
    ids = {registry_id(shard): shard for shard in range(REGISTRY_SHARDS)}
    query = "WorkflowType = 'NodeRegistryWorkflow' AND ExecutionStatus = 'Running'"
    return {ids[run.id] async for run in client.list_workflows(query) if run.id in ids}


async def drain_node(client: Client, name: str, by: str = "") -> None:
    await node_registry(client, name).signal(NodeRegistryWorkflow.drain, NodeRef(name=name, by=by))


async def undrain_node(client: Client, name: str, by: str = "") -> None:
    await node_registry(client, name).signal(
        NodeRegistryWorkflow.undrain, NodeRef(name=name, by=by)
    )


async def episodes_on(client: Client, node: str) -> int:
    """Open episodes whose sandbox is on `node` (visibility's `SandboxNode`)."""
    query = (
        "WorkflowType = 'EpisodeWorkflow' AND ExecutionStatus = 'Running' "
        f"AND SandboxNode = '{node}'"
    )
    return (await client.count_workflows(query)).count


async def forget_node(client: Client, name: str, by: str = "") -> None:
    """Drop `name` from every shard that holds it (its own, and shard 0 of old)."""
    handles = {registry_id(shard_of(name)): node_registry(client, name)}
    handles.setdefault(REGISTRY_WORKFLOW_ID, registry_handle(client, 0))
    for handle in handles.values():
        with contextlib.suppress(RPCError):  # a shard that never started holds nothing
            await handle.signal(NodeRegistryWorkflow.forget, NodeRef(name=name, by=by))
