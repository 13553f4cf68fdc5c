"""RecordWriter / load_records: round trip, part files, concurrency, edge cases."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from obs_synthetic import START, Synthetic

from observability.records import (
    AlertRecord,
    EpisodeRecord,
    RecordWriter,
    StepRecord,
    load_records,
    schema,
)


def _episode(i: int, **over: object) -> EpisodeRecord:
    fields: dict[str, object] = {
        "workflow_id": f"wf-{i}",
        "image": "busybox",
        "node": "n1",
        "started_at": START,
        "ended_at": START + timedelta(seconds=2),
        "duration_s": 2.0,
        "outcome": "completed",
    }
    fields.update(over)
    return EpisodeRecord.model_validate(fields)


def test_round_trip_keeps_every_field(records_dir: Path, synthetic: Synthetic) -> None:
    records = load_records(records_dir)
    assert records.episodes.height == len(synthetic.episodes)
    assert records.steps.height == len(synthetic.steps)
    assert records.alerts.height == len(synthetic.alerts)
    by_id = {r["workflow_id"]: r for r in records.episodes.to_dicts()}
    for expected in synthetic.episodes:
        assert EpisodeRecord.model_validate(by_id[expected.workflow_id]) == expected
    steps = {(r["workflow_id"], r["index"]): r for r in records.steps.to_dicts()}
    for step in synthetic.steps:
        assert StepRecord.model_validate(steps[(step.workflow_id, step.index)]) == step


def test_frames_have_the_declared_schema(records_dir: Path) -> None:
    records = load_records(records_dir)
    assert dict(records.episodes.schema) == schema("episodes")
    assert dict(records.steps.schema) == schema("steps")
    assert dict(records.alerts.schema) == schema("alerts")


def test_buffer_splits_into_part_files(records_dir: Path, synthetic: Synthetic) -> None:
    parts = sorted((records_dir / "episodes").glob("part-*.parquet"))
    assert len(parts) == -(-len(synthetic.episodes) // 97)  # one per flushed chunk
    assert all(p.name.startswith("part-") and len(p.stem.split("-")) == 3 for p in parts)
    assert not list((records_dir / "episodes").glob(".*"))  # no temp file left behind


def test_empty_store_gives_empty_frames_with_schema(tmp_path: Path) -> None:
    records = load_records(tmp_path / "never-written")
    assert records.empty
    assert dict(records.episodes.schema) == schema("episodes")
    assert dict(records.alerts.schema) == schema("alerts")


def test_concurrent_appends_lose_nothing(tmp_path: Path) -> None:
    threads, per_thread = 8, 250
    with RecordWriter(tmp_path, max_rows=64, flush_interval_s=0.01) as writer:

        def work(t: int) -> None:
            for i in range(per_thread):
                writer.append(_episode(t * per_thread + i))

        workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    ids = load_records(tmp_path).episodes["workflow_id"]
    assert ids.len() == threads * per_thread
    assert ids.n_unique() == threads * per_thread


def test_background_flush_on_interval(tmp_path: Path) -> None:
    writer = RecordWriter(tmp_path, max_rows=10_000, flush_interval_s=0.05)
    try:
        writer.append(_episode(1))
        deadline = time.monotonic() + 30  # generous: only guards against a hang
        while writer.pending() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert load_records(tmp_path).episodes.height == 1
    finally:
        writer.close()


def test_flush_on_size_without_waiting_for_interval(tmp_path: Path) -> None:
    writer = RecordWriter(tmp_path, max_rows=5, flush_interval_s=3600)
    try:
        writer.extend([_episode(i) for i in range(5)])
        deadline = time.monotonic() + 30
        while writer.pending() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert load_records(tmp_path).episodes.height == 5
    finally:
        writer.close()


def test_close_flushes_and_is_idempotent(tmp_path: Path) -> None:
    writer = RecordWriter(tmp_path, flush_interval_s=3600)
    writer.append(_episode(1))
    writer.append(StepRecord(workflow_id="wf-1", index=0, command="true", duration_s=0.01,
                             started_at=START))  # fmt: skip
    writer.close()
    writer.close()
    records = load_records(tmp_path)
    assert (records.episodes.height, records.steps.height) == (1, 1)
    with pytest.raises(RuntimeError, match="closed"):
        writer.append(_episode(2))


def test_flush_returns_the_parts_written(tmp_path: Path) -> None:
    with RecordWriter(tmp_path, flush_interval_s=3600) as writer:
        writer.append(_episode(1))
        writer.append(AlertRecord(rule="r", priority="Warning", action="notify", time=START))
        parts = writer.flush()
        assert sorted(p.parent.name for p in parts) == ["alerts", "episodes"]
        assert writer.flush() == []  # nothing buffered, nothing written


def test_failed_write_keeps_rows_for_next_flush(tmp_path: Path) -> None:
    blocker = tmp_path / "store"
    blocker.write_text("a file where the directory should be")
    writer = RecordWriter(blocker, flush_interval_s=3600)
    writer.append(_episode(1))
    with pytest.raises(OSError):
        writer.flush()
    assert writer.pending() == 1
    blocker.unlink()
    writer.close()
    assert load_records(blocker).episodes.height == 1


def test_unknown_record_type_is_refused(tmp_path: Path) -> None:
    with RecordWriter(tmp_path) as writer, pytest.raises(TypeError):
        writer.append("not a record")  # type: ignore[arg-type]


def test_naive_times_are_utc_and_episode_id_defaults() -> None:
    naive = datetime(2025, 1, 1, 12, 0)
    record = _episode(1, started_at=naive, ended_at=naive)
    assert record.started_at == naive.replace(tzinfo=UTC)
    assert record.episode_id == "wf-1"
    assert _episode(2, episode_id="ep-2").episode_id == "ep-2"


def test_bad_outcome_is_rejected() -> None:
    with pytest.raises(ValueError, match="outcome"):
        _episode(1, outcome="exploded")


def test_parts_with_all_null_columns_still_concat(tmp_path: Path) -> None:
    # A part where reward is all None and one where it is set must load together.
    with RecordWriter(tmp_path) as writer:
        writer.append(_episode(1, reward=None))
        writer.flush()
        writer.append(_episode(2, reward=0.5))
    rewards = load_records(tmp_path).episodes.sort("workflow_id")["reward"]
    assert rewards.dtype == pl.Float64
    assert rewards.to_list() == [None, 0.5]
