"""The workflow worker: runs Corral's deterministic workflows (no sandbox I/O).

python -m workers.workflow_worker
"""

from __future__ import annotations

import asyncio
import contextlib
import signal

from temporalio.worker import Worker

from activities.placement import FleetActivities
from contract.config import StackConfig, load_config
from observability.extras import require_at_start
from observability.metrics import setup_metrics, temporal_runtime_with_prometheus
from observability.records import RecordWriter
from observability.tracing import flush_tracing, setup_tracing
from workers.node_directory import NodeDirectory
from workers.temporal import connect, workflow_runner
from workflows.registry import WORKFLOWS


async def run_workflow_worker(config: StackConfig, stop: asyncio.Event) -> None:
    setup_tracing(
        "corral-workflow-worker",
        exporter=config.observability.traces,
        path=config.traces_file,
        otlp_endpoint=config.observability.otlp_endpoint,
    )
    otel_port, sdk_port = config.metrics_ports()
    metrics = setup_metrics("corral-workflow-worker", prometheus_port=otel_port)
    runtime = temporal_runtime_with_prometheus(sdk_port)
    client = await connect(config, runtime=runtime)
    directory = NodeDirectory(client)
    records = RecordWriter(config.records_dir)
    fleet = FleetActivities(
        directory.nodes,
        client,
        nodes_when_empty=directory.nodes_when_empty,
        records=records,
        metrics=metrics,
    )
    worker = Worker(
        client,
        task_queue=config.workers.workflow_task_queue,
        workflows=WORKFLOWS,
        activities=[fleet.place, fleet.live_nodes, fleet.node_lost, fleet.record_episode],
        max_concurrent_workflow_tasks=200,
        workflow_runner=workflow_runner(),
    )
    refresh = asyncio.create_task(directory.refresh_forever(stop))
    async with worker:
        await stop.wait()
    await refresh
    records.close()
    metrics.close()
    flush_tracing()


def main() -> None:
    require_at_start("polars", "export", "the workflow worker (Parquet records)")
    config = load_config()
    stop = asyncio.Event()

    async def _run() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_workflow_worker(config, stop)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_run())


if __name__ == "__main__":
    main()
