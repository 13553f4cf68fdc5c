"""Tracing: file exporter round trip, nested spans, set-up switching, trace_tree."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path

import polars as pl
import pytest

from observability import tracing
from observability.tracing import (
    ATTR_NODE,
    ATTR_SANDBOX_ID,
    TracingSetupError,
    flush_tracing,
    read_spans,
    setup_tracing,
    span,
    span_schema,
    temporal_tracing_interceptor,
    trace_tree,
)

# The provider is per process and its service name is fixed by the first call;
# every observability test uses this one name.
SERVICE = "corral-test"


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    path = tmp_path / "spans.jsonl"
    setup_tracing(SERVICE, path=path)
    return path


def _spans(path: Path) -> pl.DataFrame:
    assert flush_tracing()
    return read_spans(path)


@span("decorated.async", **{ATTR_NODE: "node-a"})
async def _containerd_call(delay: float) -> str:
    await asyncio.sleep(delay)
    return "ok"


@span("decorated.sync")
def _sync_call() -> int:
    return 42


async def test_nested_spans_round_trip(trace_file: Path) -> None:
    async with span("episode", **{ATTR_SANDBOX_ID: "sb-1", "skipped": None}):
        with span("provision", steps=3):
            assert await _containerd_call(0.001) == "ok"
        assert _sync_call() == 42
    df = _spans(trace_file)
    assert dict(df.schema) == span_schema()
    rows = {r["name"]: r for r in df.to_dicts()}
    assert set(rows) == {"episode", "provision", "decorated.async", "decorated.sync"}
    assert df["trace_id"].n_unique() == 1
    assert rows["episode"]["parent_id"] is None
    assert rows["provision"]["parent_id"] == rows["episode"]["span_id"]
    assert rows["decorated.async"]["parent_id"] == rows["provision"]["span_id"]
    assert rows["decorated.sync"]["parent_id"] == rows["episode"]["span_id"]
    assert json.loads(rows["episode"]["attributes"]) == {ATTR_SANDBOX_ID: "sb-1"}
    assert json.loads(rows["decorated.async"]["attributes"]) == {ATTR_NODE: "node-a"}
    # Fixed by the first set-up in this process, which may be another test's.
    service = setup_tracing(SERVICE, path=trace_file).resource.attributes["service.name"]
    assert all(r["service_name"] == service for r in rows.values())
    assert all(r["end_ns"] >= r["start_ns"] for r in rows.values())


async def test_concurrent_tasks_keep_their_own_parents(trace_file: Path) -> None:
    async def episode(i: int) -> None:
        async with span(f"episode-{i}"):
            await _containerd_call(0.001 * (3 - i))

    await asyncio.gather(*(episode(i) for i in range(3)))
    df = _spans(trace_file)
    roots = df.filter(pl.col("parent_id").is_null())
    assert roots.height == 3 and df["trace_id"].n_unique() == 3
    children = df.filter(pl.col("name") == "decorated.async")
    parent_names = children.join(roots, left_on="parent_id", right_on="span_id")["name_right"]
    assert sorted(parent_names.to_list()) == ["episode-0", "episode-1", "episode-2"]


def test_exception_marks_the_span_as_error(trace_file: Path) -> None:
    with pytest.raises(ValueError), span("failing"):
        raise ValueError("containerd said no")
    row = _spans(trace_file).row(0, named=True)
    assert row["status"] == "ERROR"
    assert "containerd said no" in (row["status_description"] or "")


def test_trace_tree_indents_children(trace_file: Path) -> None:
    with span("root", **{ATTR_NODE: "node-b"}), span("child"), span("grandchild"):
        pass
    df = _spans(trace_file)
    tree = trace_tree(df, df["trace_id"][0]).splitlines()
    assert [line.split(" (")[0] for line in tree] == ["root", "  child", "    grandchild"]
    assert "corral.node=node-b" in tree[0]


def test_same_arguments_is_a_no_op(trace_file: Path) -> None:
    provider = setup_tracing(SERVICE, path=trace_file)
    processor = tracing._switch._inner if tracing._switch else None
    assert setup_tracing(SERVICE, path=trace_file) is provider
    assert (tracing._switch._inner if tracing._switch else None) is processor


def test_switching_file_moves_new_spans(tmp_path: Path) -> None:
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    provider = setup_tracing(SERVICE, path=first)
    with span("one"):
        pass
    assert setup_tracing(SERVICE, path=second) is provider  # still the global provider
    with span("two"):
        pass
    assert _spans(first)["name"].to_list() == ["one"]  # switching flushed the old file
    assert _spans(second)["name"].to_list() == ["two"]


def test_exporter_none_drops_spans(tmp_path: Path) -> None:
    setup_tracing(SERVICE, exporter="none")
    with span("dropped"):
        pass
    assert flush_tracing()
    setup_tracing(SERVICE, path=tmp_path / "after.jsonl")
    assert read_spans(tmp_path / "after.jsonl").is_empty()


def test_unknown_exporter_is_a_clear_error() -> None:
    with pytest.raises(TracingSetupError, match="unknown trace exporter 'zipkin'"):
        setup_tracing(SERVICE, exporter="zipkin")


@pytest.mark.skipif(
    importlib.util.find_spec("opentelemetry.exporter.otlp") is not None,
    reason="opentelemetry-exporter-otlp is installed here",
)
def test_otlp_without_package_names_it() -> None:
    with pytest.raises(TracingSetupError, match="opentelemetry-exporter-otlp"):
        setup_tracing(SERVICE, exporter="otlp", otlp_endpoint="http://127.0.0.1:4317")


def test_read_spans_missing_file_and_torn_line(tmp_path: Path) -> None:
    assert read_spans(tmp_path / "missing.jsonl").is_empty()
    path = tmp_path / "torn.jsonl"
    good = {"trace_id": "a" * 32, "span_id": "b" * 16, "name": "x", "start_ns": 1, "end_ns": 2}
    path.write_text(json.dumps(good) + "\n" + '{"trace_id": "cut of')
    df = read_spans(path)
    assert df["name"].to_list() == ["x"] and df["duration_ms"][0] == pytest.approx(1e-6)


def test_temporal_interceptor_uses_corral_provider(trace_file: Path) -> None:
    interceptor = temporal_tracing_interceptor()
    with interceptor.tracer.start_as_current_span("via-interceptor-tracer"):
        pass
    assert _spans(trace_file)["name"].to_list() == ["via-interceptor-tracer"]
