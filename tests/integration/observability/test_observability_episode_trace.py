"""A trace of one real episode shows its containerd calls under its workflow."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import polars as pl
import pytest

from contract.config import StackConfig
from contract.models import EpisodeSpec
from corral.sdk import Corral
from observability.tracing import flush_tracing, read_spans

pytestmark = pytest.mark.integration


# From three processes (client, workflow worker, node worker), each exporting
# in batches: wait until all have written theirs. A one-step scripted episode
# takes the lean path: one node activity (its teardown follows the result, off
# the episode's critical path, so it is not waited for here).
EXPECTED_SPANS = {
    "RunWorkflow:EpisodeWorkflow",
    "RunActivity:corral.run_scripted",
    "corral.provision",
    "containerd/Tasks/Create",
}


def _exec_span(config: StackConfig) -> str:
    """The step's own span: a call through the exec agent (the default) is no
    containerd RPC; with the agent off it is runc's exec."""
    return "agent/run" if config.workers.exec_agent else "containerd/Tasks/Exec"


def _ancestors(df: pl.DataFrame, span_id: str) -> list[str]:
    parents = dict(zip(df["span_id"], df["parent_id"], strict=True))
    names = dict(zip(df["span_id"], df["name"], strict=True))
    chain, current = [], parents.get(span_id)
    while current:
        chain.append(names.get(current, "?"))
        current = parents.get(current)
    return chain


async def _trace_of(
    config: StackConfig, workflow_id: str, expected: set[str], timeout_s: float = 90
) -> pl.DataFrame:
    """The episode's spans, once the workers' batch exporters have written them.

    Found by the workflow's own span (the workflow worker writes it to the
    stack's file), so the test does not depend on which tracer provider this
    test process happened to get first."""
    deadline = time.monotonic() + timeout_s
    seen: set[str] = set()
    while True:
        df = read_spans(config.traces_file)
        runs = df.filter(
            pl.col("name").is_in(["StartWorkflow:EpisodeWorkflow", "RunWorkflow:EpisodeWorkflow"])
        ).filter(
            pl.col("attributes").map_elements(
                lambda a: json.loads(a).get("temporalWorkflowID") == workflow_id,
                return_dtype=pl.Boolean,
            )
        )
        if len(runs):
            trace = df.filter(pl.col("trace_id") == runs["trace_id"][0])
            seen = set(trace["name"])
            if seen >= expected:
                return trace
        if time.monotonic() > deadline:
            raise AssertionError(
                f"no complete trace for {workflow_id} in {config.traces_file}: "
                f"missing {sorted(expected - seen)}"
            )
        await asyncio.sleep(0.5)


async def test_episode_trace_reaches_containerd(corral: Corral, stack_config: StackConfig) -> None:
    episode_id = f"trace-{uuid.uuid4().hex[:8]}"
    result = await corral.run_episode(
        EpisodeSpec(image="busybox", steps=["echo traced"]), episode_id=episode_id
    )
    assert result.outcome == "completed"
    flush_tracing()
    exec_span = _exec_span(stack_config)
    trace = await _trace_of(stack_config, episode_id, EXPECTED_SPANS | {exec_span})
    assert set(trace["name"]) >= EXPECTED_SPANS | {exec_span}
    by_name = {row["name"]: row for row in trace.iter_rows(named=True)}
    create_chain = _ancestors(trace, by_name["containerd/Tasks/Create"]["span_id"])
    assert create_chain[:2] == ["corral.provision", "RunActivity:corral.run_scripted"]
    assert "StartActivity:corral.run_scripted" in create_chain  # scheduled by the workflow
    exec_chain = _ancestors(trace, by_name[exec_span]["span_id"])
    assert "RunActivity:corral.run_scripted" in exec_chain
    provision = json.loads(by_name["corral.provision"]["attributes"])
    assert provision["corral.workflow_id"] == episode_id
    assert provision["corral.sandbox_id"] == result.sandbox_id
    assert provision["corral.node"] == result.node
