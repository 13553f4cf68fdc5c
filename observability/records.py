"""The analysis store: episode, step and alert records as Parquet part files.

Episodes append records from many activities and threads; a write only takes a
lock and appends to a list. A background thread turns the buffer into a
Parquet part file when it is big enough or old enough, so episodes never wait
on disk. Part files are immutable (write to a temp name, then rename), so a
reader never sees half a file and no two writers ever touch the same file.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from observability.extras import require

if TYPE_CHECKING:
    # polars is in the `export` extra: the record models import without it
    # (activities and the SDK use them); only writing and reading need it.
    import polars as pl

__all__ = [
    "OUTCOMES",
    "AlertRecord",
    "EpisodeAlert",
    "EpisodeRecord",
    "Outcome",
    "RecordWriter",
    "Records",
    "StepRecord",
    "load_records",
    "schema",
]

log = logging.getLogger(__name__)

Outcome = Literal[
    "completed", "failed", "killed", "quarantined", "released", "timed_out", "cancelled"
]
OUTCOMES: tuple[str, ...] = Outcome.__args__  # type: ignore[attr-defined]


def _utc(value: datetime) -> datetime:
    # Naive times are taken as UTC: Parquet keeps one zone per column and
    # mixing naive and aware would fail at concat time, long after the write.
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="after")
    @classmethod
    def _times_in_utc(cls, value: Any) -> Any:
        return _utc(value) if isinstance(value, datetime) else value


class EpisodeAlert(_Record):
    rule: str
    priority: str
    action: str
    time: datetime


class EpisodeRecord(_Record):
    """One finished episode. `episode_id` is the workflow id unless told otherwise."""

    workflow_id: str
    episode_id: str = ""
    run_id: str | None = None
    tenant: str | None = None
    image: str
    node: str | None = None
    spec_hash: str | None = None
    started_at: datetime
    ended_at: datetime
    duration_s: float
    outcome: Outcome
    reason: str | None = None
    reward: float | None = None
    steps: int = 0
    provision_s: float | None = None
    teardown_s: float | None = None
    alerts: list[EpisodeAlert] = []

    @model_validator(mode="before")
    @classmethod
    def _episode_id_defaults_to_workflow_id(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("episode_id") and data.get("workflow_id"):
            data = {**data, "episode_id": data["workflow_id"]}
        return data


class StepRecord(_Record):
    workflow_id: str
    index: int
    command: str
    exit_code: int | None = None
    duration_s: float
    timed_out: bool = False
    started_at: datetime


class AlertRecord(_Record):
    workflow_id: str | None = None  # None: the sandbox's episode was not known
    rule: str
    priority: str
    action: str
    time: datetime
    container_id: str | None = None
    proc_cmdline: str | None = None
    image: str | None = None
    node: str | None = None


def _polars() -> ModuleType:
    return require("polars", "export", "Parquet records")


@cache
def _schemas() -> dict[str, dict[str, pl.DataType]]:
    """kind (also the sub-directory name) -> its Parquet schema."""
    pl = _polars()
    time = pl.Datetime("us", "UTC")
    alert = {"rule": pl.String(), "priority": pl.String(), "action": pl.String(), "time": time}
    return {
        "episodes": {
            "workflow_id": pl.String(),
            "episode_id": pl.String(),
            "run_id": pl.String(),
            "tenant": pl.String(),
            "image": pl.String(),
            "node": pl.String(),
            "spec_hash": pl.String(),
            "started_at": time,
            "ended_at": time,
            "duration_s": pl.Float64(),
            "outcome": pl.String(),
            "reason": pl.String(),
            "reward": pl.Float64(),
            "steps": pl.Int64(),
            "provision_s": pl.Float64(),
            "teardown_s": pl.Float64(),
            "alerts": pl.List(pl.Struct(alert)),
        },
        "steps": {
            "workflow_id": pl.String(),
            "index": pl.Int64(),
            "command": pl.String(),
            "exit_code": pl.Int64(),
            "duration_s": pl.Float64(),
            "timed_out": pl.Boolean(),
            "started_at": time,
        },
        "alerts": {
            "workflow_id": pl.String(),
            "rule": pl.String(),
            "priority": pl.String(),
            "action": pl.String(),
            "time": time,
            "container_id": pl.String(),
            "proc_cmdline": pl.String(),
            "image": pl.String(),
            "node": pl.String(),
        },
    }


def schema(kind: str) -> dict[str, pl.DataType]:
    """The Parquet schema of `kind` (episodes, steps, alerts); needs polars."""
    return _schemas()[kind]


_KINDS: dict[str, type[_Record]] = {
    "episodes": EpisodeRecord,
    "steps": StepRecord,
    "alerts": AlertRecord,
}
_KIND_OF: dict[type[_Record], str] = {cls: kind for kind, cls in _KINDS.items()}

AnyRecord = EpisodeRecord | StepRecord | AlertRecord


def _frame(kind: str, rows: list[dict[str, Any]]) -> pl.DataFrame:
    return _polars().DataFrame(rows, schema=_schemas()[kind])


def _part_name() -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    return f"part-{stamp}-{uuid.uuid4().hex}.parquet"


def _write_part(directory: Path, kind: str, rows: list[dict[str, Any]]) -> Path:
    folder = directory / kind
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / _part_name()
    temp = folder / f".{final.name}.tmp"  # not matched by the readers' part-*.parquet
    _frame(kind, rows).write_parquet(temp)
    os.replace(temp, final)
    return final


class RecordWriter:
    """Buffered, thread-safe appender of records to `<dir>/<kind>/part-*.parquet`.

    `append()` never touches the disk. A daemon thread flushes when any buffer
    holds `max_rows` records or `flush_interval_s` has passed; `flush()` does
    it now, `close()` flushes and stops. Use as a context manager.
    """

    def __init__(
        self, directory: Path, *, max_rows: int = 1000, flush_interval_s: float = 5.0
    ) -> None:
        _polars()  # fail at start, in one line, not in the flush thread later
        self.directory = Path(directory)
        self.max_rows = max_rows
        self.flush_interval_s = flush_interval_s
        self._buffers: dict[str, list[dict[str, Any]]] = {kind: [] for kind in _KINDS}
        self._writing = 0  # rows taken from the buffers and not yet in a part file
        self._lock = threading.Lock()  # guards the buffers and _writing
        self._flush_lock = threading.Lock()  # one flush at a time, in file order
        self._wake = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="corral-records", daemon=True)
        self._thread.start()

    def append(self, record: AnyRecord) -> None:
        kind = _KIND_OF.get(type(record))
        if kind is None:
            raise TypeError(f"not a Corral record: {type(record).__name__}")
        row = record.model_dump()
        with self._lock:
            if self._closed:
                raise RuntimeError("RecordWriter is closed")
            buffer = self._buffers[kind]
            buffer.append(row)
            full = len(buffer) >= self.max_rows
        if full:
            self._wake.set()

    def extend(self, records: list[AnyRecord]) -> None:
        for record in records:
            self.append(record)

    def pending(self) -> int:
        """Rows not yet readable from a part file (buffered, or being written)."""
        with self._lock:
            return self._writing + sum(len(b) for b in self._buffers.values())

    def flush(self) -> list[Path]:
        """Write everything buffered now; returns the part files written."""
        with self._flush_lock:
            with self._lock:
                taken = {k: rows for k, rows in self._buffers.items() if rows}
                self._buffers = {k: [] if k in taken else rows for k, rows in self._buffers.items()}
                self._writing = sum(len(rows) for rows in taken.values())
            try:
                return [self._write_or_requeue(kind, rows) for kind, rows in taken.items()]
            finally:
                with self._lock:
                    self._writing = 0

    def _write_or_requeue(self, kind: str, rows: list[dict[str, Any]]) -> Path:
        try:
            return _write_part(self.directory, kind, rows)
        except Exception:
            # Keep the rows for the next flush rather than lose them (disk
            # full, directory briefly gone); the caller sees the error.
            with self._lock:
                self._buffers[kind][:0] = rows
            raise

    def _run(self) -> None:
        while True:
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            if self._closed:
                return
            try:
                self.flush()
            except Exception:
                log.exception("flushing records to %s failed; will retry", self.directory)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._wake.set()
        self._thread.join()
        self.flush()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


@dataclass(frozen=True)
class Records:
    episodes: pl.DataFrame
    steps: pl.DataFrame
    alerts: pl.DataFrame

    @property
    def empty(self) -> bool:
        return self.episodes.is_empty() and self.steps.is_empty() and self.alerts.is_empty()


def _load_kind(directory: Path, kind: str) -> pl.DataFrame:
    pl = _polars()
    schema = _schemas()[kind]
    parts = sorted((directory / kind).glob("part-*.parquet"))
    if not parts:
        return pl.DataFrame(schema=schema)
    # Cast to the current schema so part files from older writers still line up.
    frame = pl.scan_parquet(parts, missing_columns="insert", extra_columns="ignore").collect()
    return frame.select(
        [
            pl.col(n).cast(t) if n in frame.columns else pl.lit(None, dtype=t).alias(n)
            for n, t in schema.items()
        ]
    )


def load_records(directory: Path) -> Records:
    """Every part file under `directory`; empty frames with the schema when none."""
    d = Path(directory)
    return Records(
        episodes=_load_kind(d, "episodes"),
        steps=_load_kind(d, "steps"),
        alerts=_load_kind(d, "alerts"),
    )
