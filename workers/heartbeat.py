"""A node's heartbeat to the node registry: who it is, what it holds, how busy.

Looked at every `HEARTBEAT_EVERY_S` by each node worker and sent (signal-with-
start of its `NodeRegistryWorkflow` shard) when placement's facts changed, so
a node on any host joins the fleet by reaching Temporal. Liveness is the
presence activity the registry runs on the node (`activities/presence.py`);
only while none runs does the loop send a keep-alive (`BeatGate`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from importlib.metadata import PackageNotFoundError, version

from temporalio.client import Client

from activities.node import NodeActivities
from activities.pool import WarmPool
from activities.presence import Presence
from contract.config import StackConfig
from contract.models import NodeHeartbeat
from sandbox import Containerd
from workflows.nodes import HEARTBEAT_EVERY_S, BeatGate, send_heartbeat

log = logging.getLogger("corral.heartbeat")


def corral_version() -> str:
    with contextlib.suppress(PackageNotFoundError):
        return version("corral")
    return "unknown"


async def build_heartbeat(
    config: StackConfig,
    node: str,
    activities: NodeActivities,
    containerd: Containerd,
    pool: WarmPool | None,
    boot: str = "",
) -> NodeHeartbeat:
    images = await containerd.images.list()
    return NodeHeartbeat(
        name=node,
        task_queue=config.node_task_queue(node),
        version=corral_version(),
        capacity=activities.capacity,
        use=await activities.use(),
        images=sorted(image.name for image in images),
        warm=pool.counts() if pool is not None else {},
        load1=os.getloadavg()[0],
        host=socket.gethostname(),
        boot=boot,
    )


async def heartbeat_forever(
    client: Client,
    config: StackConfig,
    node: str,
    activities: NodeActivities,
    containerd: Containerd,
    presence: Presence,
    pool: WarmPool | None = None,
) -> None:
    """Until cancelled; a failed beat is logged and the next one tried."""
    gate = BeatGate()
    boot = uuid.uuid4().hex[:12]  # this worker process, for the registry
    tick = time.monotonic()
    while True:
        try:
            beat = await build_heartbeat(config, node, activities, containerd, pool, boot)
            if gate.due(beat, tick, presence.armed):
                await send_heartbeat(client, config.workers.workflow_task_queue, beat)
                gate.sent(beat, tick)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            log.warning("heartbeat of %s not sent: %s", node, err)
        tick = await next_tick(tick)


async def next_tick(tick: float) -> float:
    """Sleep to the next tick of a fixed 5 s cadence: a slow send must not push
    every later beat back (beats 15 s apart make placement skip the node)."""
    due = max(tick + HEARTBEAT_EVERY_S, time.monotonic())
    await asyncio.sleep(due - time.monotonic())
    return due
