"""The node worker: serves one node's task queue with that node's containerd.

    python -m workers.node_worker --node node-1

It also watches containerd's event stream for OOM kills (counted in metrics)
and flushes episode records to the analysis store, and heartbeats to the node
registry (`workers/heartbeat.py`) once it serves.

Before it polls for work it reaps: a node that crashed or was lost comes
back with sandboxes whose episodes have ended meanwhile (the registry failed
them), and nothing else would remove those before the janitor's next round.

Every few minutes it removes the node's fork and user snapshot images that
nothing needs any more (`sandbox/snapshot_gc.py`, `nodes.snapshot_retention_s`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal

from temporalio.worker import Worker

from activities.capacity import node_capacity
from activities.foreground import Foreground
from activities.gateway import NodeGateway
from activities.node import NodeActivities
from activities.pool import WarmPool
from activities.presence import HEARTBEAT_THROTTLE, Presence
from activities.sensorwatch import SensorWatch
from activities.snapshots import SnapshotActivities
from activities.toolcalls import ToolCallActivities
from contract.config import StackConfig, load_config
from contract.errors import CorralError
from contract.models import ReapInput
from observability.extras import require_at_start
from observability.metrics import Metrics, setup_metrics, temporal_runtime_with_prometheus
from observability.records import RecordWriter
from observability.tracing import flush_tracing, setup_tracing
from sandbox import Containerd
from sandbox.registry import registry_options
from sandbox.snapshot_gc import collect_snapshots
from sandbox.userns import UidPool
from workers.heartbeat import heartbeat_forever
from workers.temporal import connect, workflow_runner
from workflows.calls import EpisodeCallsWorkflow

log = logging.getLogger("corral.node")
SNAPSHOT_GC_EVERY_S = 300.0


async def watch_ooms(containerd: Containerd, node: str, metrics: Metrics) -> None:
    async for event in containerd.events(("/tasks/oom",)):
        log.warning("OOM kill in sandbox %s on %s", event.sandbox_id, node)
        metrics.record_oom_kill(node)


async def collect_snapshots_forever(
    containerd: Containerd,
    node: str,
    retention_s: float,
    metrics: Metrics,
    *,
    every_s: float = SNAPSHOT_GC_EVERY_S,
    foreground: Foreground | None = None,
) -> None:
    """Each round removes the snapshot images nothing needs (sandbox/snapshot_gc.py);
    a round that fails is logged and the next one tries again."""
    while True:
        await asyncio.sleep(every_s)
        if foreground is not None:
            await foreground.quiet()  # after the steps running now
        try:
            removed = await collect_snapshots(containerd.connection, retention_s)
        except CorralError as err:
            log.warning("snapshot collection on %s failed: %s", node, err)
            continue
        except Exception:
            log.exception("snapshot collection on %s failed", node)
            continue
        if removed:
            log.info("collected %d snapshot images on %s: %s", len(removed), node,
                     ", ".join(removed))  # fmt: skip
            metrics.record_snapshots_collected(node, len(removed))


async def run_node_worker(config: StackConfig, node: str, stop: asyncio.Event) -> None:
    setup_tracing(
        f"corral-node-{node}",
        exporter=config.observability.traces,
        path=config.traces_file,
        otlp_endpoint=config.observability.otlp_endpoint,
    )
    otel_port, sdk_port = config.metrics_ports(node)
    metrics = setup_metrics(f"corral-node-{node}", prometheus_port=otel_port)
    client = await connect(config, runtime=temporal_runtime_with_prometheus(sdk_port))
    containerd = await Containerd.connect(
        str(config.containerd_socket(node)),
        namespace=config.nodes.containerd_namespace,
        uid_pool=UidPool(start=config.nodes.userns.start, size=config.nodes.userns.size),
        shim_group_size=config.nodes.shim_group_size,
        exec_agent=config.workers.exec_agent,  # docs/agent.md; on by default
    )
    records = RecordWriter(config.records_dir)
    foreground = Foreground()  # steps first; pool refills and teardowns wait for them
    pool = WarmPool(containerd, node, config.workers.warm_pool, foreground=foreground)
    await pool.start()
    peers = {n: config.containerd_socket(n) for n in config.node_names() if n != node}
    snapshots = SnapshotActivities(
        node,
        containerd,
        peers,
        registry=config.registry.default,
        registry_options=registry_options(config.registry),
        foreground=foreground,
    )
    sensor = SensorWatch(
        config.sensor_socket(node),
        enabled=config.sensor.enabled,
        required=config.sensor.required,
        settle_timeout_s=config.sensor.settle_timeout_s,
    )
    # The model gateway: sandboxes that ask for it reach it on their loopback.
    gateway = NodeGateway(config.node_dir(node))
    node_activities = NodeActivities(
        node,
        containerd,
        config.node_dir(node),
        temporal=client,
        records=records,
        metrics=metrics,
        pool=pool,
        foreground=foreground,
        registry=registry_options(config.registry),
        fetch_image=snapshots.ensure_image,
        capacity=node_capacity(config.nodes.budget),
        sensor=sensor,
        gateway=gateway,
    )
    # Sessions and jobs through the exec agent (docs/agent.md), watched like steps.
    tool_calls = ToolCallActivities(
        node,
        containerd,
        config.node_dir(node),
        sensor=sensor,
        registry=registry_options(config.registry),
        gateway=gateway,
    )
    presence = Presence()  # the registry's liveness check, run here (workflows/nodes.py)
    oom_watch = asyncio.create_task(watch_ooms(containerd, node, metrics))
    background: list[asyncio.Task[None]] = [oom_watch]
    try:
        await reap_leftovers(node_activities)
        await snapshots.resume_staged()  # snapshots an earlier worker left half-made
        await gateway.reopen(lambda sandbox_id: sandbox_pid(containerd, sandbox_id))
        worker = Worker(
            client,
            task_queue=config.node_task_queue(node),
            # Interactive episodes' calls: run here, their steps as local activities.
            workflows=[EpisodeCallsWorkflow],
            workflow_runner=workflow_runner(),
            activities=[
                *node_activities.activities(),
                *snapshots.activities(),
                *tool_calls.activities(),
                *presence.activities(),
            ],
            max_concurrent_activities=500,
            max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,  # presence's margin
        )
        async with worker:
            beats = heartbeat_forever(
                client, config, node, node_activities, containerd, presence, pool
            )
            background.append(asyncio.create_task(beats))
            retention_s = config.nodes.snapshot_retention_s
            if retention_s > 0:
                collect = collect_snapshots_forever(
                    containerd, node, retention_s, metrics, foreground=foreground
                )
                background.append(asyncio.create_task(collect))
            await stop.wait()
    finally:
        await node_activities.drain()
        await snapshots.stop()
        await gateway.stop()
        await pool.stop()  # warm sandboxes stay: the next worker adopts them
        for task in background:
            task.cancel()
        records.close()
        sensor.close()
        await containerd.close()
        metrics.close()
        flush_tracing()


async def reap_leftovers(node_activities: NodeActivities) -> None:
    """Remove sandboxes of episodes that ended while this node was away.

    No grace period: nothing provisions here before the worker polls, and
    sandboxes of episodes still running are kept (the janitor reaps them
    once they end).
    """
    result = await node_activities.reap_orphans(ReapInput(grace_s=0))
    if result.removed:
        log.warning("reaped %d leftover sandboxes on %s: %s", len(result.removed),
                    node_activities.node, ", ".join(r[:12] for r in result.removed))  # fmt: skip


async def sandbox_pid(containerd: Containerd, sandbox_id: str) -> int:
    return await (await containerd.get_sandbox(sandbox_id)).pid()


def main() -> None:
    require_at_start("polars", "export", "the node worker (Parquet records)")
    parser = argparse.ArgumentParser(description="Corral node worker")
    parser.add_argument("--node", required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    config = load_config()
    stop = asyncio.Event()

    async def _run() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_node_worker(config, args.node, stop)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_run())


if __name__ == "__main__":
    main()
