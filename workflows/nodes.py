"""The node registry: which nodes exist, what they hold, and which are lost.

Nodes on any host join through Temporal alone: each node worker signals its
heartbeat (`NodeHeartbeat`) to one long-running `NodeRegistryWorkflow` every
few seconds, signal-with-start, so the first node to come up creates it.
Placement reads the registry (through the workflow worker's cached copy, see
`activities/placement.py`); on-call drains nodes through it.

A node whose heartbeats stop for `LOST_AFTER_S` is marked lost; the registry
then tells every episode still running there (`node_lost` signal, found by
the `SandboxNode` search attribute) so that none hangs. When a lost node
heartbeats again it is ready again; its node worker reaps its leftovers
before it polls for work.
"""

from __future__ import annotations

import contextlib
from datetime import datetime, timedelta

from pydantic import BaseModel
from temporalio import workflow
from temporalio.client import Client, WorkflowHandle
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.models import NodeHeartbeat, NodeInfo, NodeLostInput, NodeRef

REGISTRY_WORKFLOW_ID = "corral-node-registry"
HEARTBEAT_EVERY_S = 5.0
# Lost within 30 s of the last heartbeat: LOST_AFTER_S plus one check period.
LOST_AFTER_S = 20.0
CHECK_EVERY_S = 5.0
RETELL_LOST_EVERY_S = 30.0
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

    @workflow.run
    async def run(self, state: RegistryState | None = None) -> None:
        while self._signals < MAX_SIGNALS_PER_RUN and not _suggested():
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: bool(self._lost_queue), timeout=timedelta(seconds=CHECK_EVERY_S)
                )
            self._mark_lost()
            while self._lost_queue:
                await self._tell_episodes(self._lost_queue.pop(0))
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(self._s)

    def _mark_lost(self) -> None:
        now = workflow.now()
        for info in self._s.nodes.values():
            silent = (now - info.last_seen).total_seconds()
            if info.state != "lost" and silent > LOST_AFTER_S:
                info.state = "lost"
                workflow.logger.warning("node %s lost: silent for %.0f s", info.name, silent)
            if info.state == "lost" and self._tell_due(info.name, now):
                # Told again while it stays lost: an episode that visibility did
                # not list yet the first time must not wait on the dead node.
                self._told[info.name] = now
                self._lost_queue.append(info.name)
        for name in [n for n in self._told if self._s.nodes[n].state != "lost"]:
            del self._told[name]

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

    @workflow.signal
    def heartbeat(self, beat: NodeHeartbeat) -> None:
        self._signals += 1
        now = workflow.now()
        known = self._s.nodes.get(beat.name)
        draining = beat.name in self._s.drained or (known is not None and known.draining)
        self._s.nodes[beat.name] = NodeInfo(
            heartbeat=beat,
            state="draining" if draining else "ready",
            draining=draining,
            last_seen=now,
            joined=known.joined if known is not None and known.state != "lost" else now,
        )

    @workflow.signal
    def drain(self, node: NodeRef) -> None:
        self._signals += 1
        self._set_draining(node.name, True)

    @workflow.signal
    def undrain(self, node: NodeRef) -> None:
        self._signals += 1
        self._set_draining(node.name, False)

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


def _suggested() -> bool:
    return workflow.info().is_continue_as_new_suggested()


# ---------------------------------------------------------------- client side
def registry_handle(client: Client) -> WorkflowHandle[NodeRegistryWorkflow, None]:
    return client.get_workflow_handle_for(NodeRegistryWorkflow.run, REGISTRY_WORKFLOW_ID)


async def send_heartbeat(client: Client, task_queue: str, beat: NodeHeartbeat) -> None:
    """Signal-with-start: the first node up creates the registry."""
    await client.start_workflow(
        NodeRegistryWorkflow.run,
        None,
        id=REGISTRY_WORKFLOW_ID,
        task_queue=task_queue,
        start_signal="heartbeat",
        start_signal_args=[beat],
    )


async def list_nodes(client: Client) -> list[NodeInfo]:
    """The registry's view; empty when no node has ever joined."""
    from temporalio.service import RPCError, RPCStatusCode

    try:
        return await registry_handle(client).query(NodeRegistryWorkflow.nodes)
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return []
        raise


async def drain_node(client: Client, name: str, by: str = "") -> None:
    await registry_handle(client).signal(NodeRegistryWorkflow.drain, NodeRef(name=name, by=by))


async def undrain_node(client: Client, name: str, by: str = "") -> None:
    await registry_handle(client).signal(NodeRegistryWorkflow.undrain, NodeRef(name=name, by=by))
