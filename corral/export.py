"""Trajectories for training pipelines: `corral export --since T --format jsonl|parquet`.

One row per closed episode: its outcome, reward (as `corral.env` computes it)
and labels, and per step the action (the command), the observation (stdout and
stderr), the exit code, timings and the Falco alerts raised while it ran.
Episodes are found in Temporal's visibility (closed since T) and read from
their results, so what is exported is what the trainer saw. Interactive file
transfers are not steps (they are in the workflow's event history).
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import IO, Literal

from pydantic import BaseModel

from contract.models import AlertSummary, EpisodeResult, ModelCall, StepResult
from corral.env import reward_of
from corral.errors import EpisodeError
from corral.sdk import Corral, EpisodeSummary
from observability.extras import require

__all__ = ["ExportFormat", "StepRow", "TrajectoryRow", "export_trajectories", "write_rows"]

ExportFormat = Literal["jsonl", "parquet"]
FORMATS: tuple[str, ...] = ("jsonl", "parquet")
FETCH_CONCURRENCY = 16  # results read at once: bounded so a big export does not flood the server
# An alert belongs to a step when raised while it ran; the sensor's event time
# may trail the step's recorded end by its reporting delay.
ALERT_GRACE = timedelta(seconds=1)


class StepRow(BaseModel):
    index: int
    source: str
    action: str
    observation: str
    stderr: str
    exit_code: int
    timed_out: bool
    output_truncated: bool
    started_at: datetime | None
    duration_s: float
    alerts: list[str]
    # The agent's model calls while the step ran, with their bodies and tokens.
    model_calls: list[ModelCall] = []


class TrajectoryRow(BaseModel):
    episode_id: str
    image: str
    tenant: str
    node: str
    labels: dict[str, str]
    outcome: str
    reason: str
    reward: float
    started_at: datetime | None
    ended_at: datetime | None
    duration_s: float
    steps: list[StepRow]
    alerts: list[str]


async def export_trajectories(
    corral: Corral, since: datetime | None, *, limit: int = 100_000
) -> list[TrajectoryRow]:
    """The newest `limit` episodes closed since `since` (all when None), oldest first."""
    query = "ExecutionStatus != 'Running'"
    if since is not None:
        query += f" AND CloseTime >= '{since.isoformat()}'"
    summaries = await corral.list_episodes(query, limit=limit)
    gate = asyncio.Semaphore(FETCH_CONCURRENCY)

    async def one(summary: EpisodeSummary) -> TrajectoryRow:
        async with gate:
            return await _trajectory(corral, summary)

    rows = await asyncio.gather(*(one(s) for s in summaries))
    return sorted(rows, key=lambda row: (row.ended_at is None, row.ended_at))


async def _trajectory(corral: Corral, summary: EpisodeSummary) -> TrajectoryRow:
    labels = await _labels(corral, summary.episode_id)
    try:
        return _row(summary, await corral.episode(summary.episode_id).result(), labels)
    except EpisodeError as err:
        if err.result is None:  # cancelled or terminated: no result was recorded
            return _bare_row(summary, err.outcome, str(err), labels)
        return _row(summary, err.result, labels)


def _row(summary: EpisodeSummary, result: EpisodeResult, labels: dict[str, str]) -> TrajectoryRow:
    return TrajectoryRow(
        episode_id=result.episode_id,
        image=result.image or summary.image,
        tenant=result.tenant or summary.tenant,
        node=result.node or summary.node,
        labels=labels,
        outcome=result.outcome,
        reason=result.reason,
        reward=reward_of(result),
        started_at=result.started_at or summary.start_time,
        ended_at=result.ended_at or summary.close_time,
        duration_s=result.duration_s,
        steps=[_step_row(step, result.alerts) for step in result.steps],
        alerts=[alert.rule for alert in result.alerts],
    )


def _bare_row(
    summary: EpisodeSummary, outcome: str, reason: str, labels: dict[str, str]
) -> TrajectoryRow:
    started, ended = summary.start_time, summary.close_time
    return TrajectoryRow(
        episode_id=summary.episode_id,
        image=summary.image,
        tenant=summary.tenant,
        node=summary.node,
        labels=labels,
        outcome=outcome,
        reason=reason,
        reward=0.0,
        started_at=started,
        ended_at=ended,
        duration_s=(ended - started).total_seconds() if started and ended else 0.0,
        steps=[],
        alerts=list(summary.anomaly_rules),
    )


async def _labels(corral: Corral, episode_id: str) -> dict[str, str]:
    """The spec's labels (task names, ...), from the workflow's first event (its input)."""
    handle = corral.client.get_workflow_handle(episode_id)
    async for event in handle.fetch_history_events(page_size=1):
        payloads = event.workflow_execution_started_event_attributes.input.payloads
        if not payloads:
            break
        labels = json.loads(payloads[0].data).get("spec", {}).get("labels") or {}
        return {str(k): str(v) for k, v in labels.items()}
    return {}


def _step_row(step: StepResult, alerts: list[AlertSummary]) -> StepRow:
    return StepRow(
        index=step.index,
        source=step.source,
        action=step.cmd,
        observation=step.stdout,
        stderr=step.stderr,
        exit_code=step.exit_code,
        timed_out=step.timed_out,
        output_truncated=step.truncated,
        started_at=step.started_at,
        duration_s=step.duration_s,
        alerts=[a.rule for a in alerts if _during(a, step)],
        model_calls=step.model_calls,
    )


def _during(alert: AlertSummary, step: StepResult) -> bool:
    if alert.time is None or step.started_at is None:
        return False
    end = step.started_at + timedelta(seconds=step.duration_s) + ALERT_GRACE
    return step.started_at <= alert.time <= end


def write_rows(rows: list[TrajectoryRow], fmt: ExportFormat, target: Path | IO[str]) -> None:
    """JSON lines (one episode a line) or one Parquet file (steps as a nested list)."""
    if fmt == "jsonl":
        lines = "".join(row.model_dump_json() + "\n" for row in rows)
        if isinstance(target, Path):
            target.write_text(lines)
        else:
            target.write(lines)
        return
    if not isinstance(target, Path):
        raise ValueError("parquet is written to a file, not a stream")
    pl = require("polars", "export", "corral export --format parquet")  # jsonl needs no polars
    records = [row.model_dump() for row in rows]
    # Labels differ between episodes: a list of key/value pairs keeps one schema.
    for record in records:
        record["labels"] = [{"key": k, "value": v} for k, v in record["labels"].items()]
    pl.DataFrame(records, infer_schema_length=None).write_parquet(target)
