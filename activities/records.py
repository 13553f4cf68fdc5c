"""An ended episode's records and metrics.

The episode's result becomes the analysis store's episode, step and alert
rows (Parquet, `observability/records.py`, buffered so it never slows the
episode) and counts its outcome and alerts in the metrics. The node's
teardown writes them on the step-by-step path, the control role
(`corral.record_episode`) for lean runs and episodes with no teardown.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from contract.models import RecordEpisodeInput, StepResult
from observability.metrics import Metrics
from observability.records import AlertRecord, EpisodeAlert, EpisodeRecord, RecordWriter, StepRecord


def record_episode(
    input: RecordEpisodeInput, records: RecordWriter | None, metrics: Metrics | None
) -> None:
    """Hand the result to the buffered Parquet writer (never slows the episode)
    and count its outcome and alerts."""
    if metrics:
        metrics.record_episode(input.result.outcome)
        for alert in input.result.alerts:
            metrics.record_alert(alert.rule, alert.action)
    if records is None:
        return
    for record in episode_records(input):
        records.append(record)


def episode_records(input: RecordEpisodeInput) -> list[Any]:
    """An episode result as the analysis store's episode, step and alert rows."""
    result = input.result
    started = result.started_at or datetime.now(UTC)
    ended = result.ended_at or started
    rows: list[Any] = [
        EpisodeRecord(
            workflow_id=input.workflow_id,
            run_id=input.run_id,
            tenant=result.tenant,
            image=result.image,
            node=result.node,
            started_at=started,
            ended_at=ended,
            duration_s=result.duration_s,
            outcome=result.outcome,
            reason=result.reason or None,
            reward=reward_value(result.reward),
            steps=len(result.steps),
            provision_s=result.provision_s,
            teardown_s=result.teardown_s,
            alerts=[
                EpisodeAlert(
                    rule=a.rule, priority=a.priority, action=a.action, time=a.time or ended
                )
                for a in result.alerts
            ],
        )
    ]
    rows += [
        StepRecord(
            workflow_id=input.workflow_id,
            index=s.index,
            command=s.cmd,
            exit_code=s.exit_code,
            duration_s=s.duration_s,
            timed_out=s.timed_out,
            started_at=s.started_at or started,
        )
        for s in result.steps
    ]
    rows += [
        AlertRecord(
            workflow_id=input.workflow_id,
            rule=a.rule,
            priority=a.priority,
            action=a.action,
            time=a.time or ended,
            image=result.image,
            node=result.node,
        )
        for a in result.alerts
    ]
    return rows


def reward_value(reward: StepResult | None) -> float | None:
    """The reward command's last output line, when it is a number."""
    if reward is None or not reward.stdout.strip():
        return None
    try:
        return float(reward.stdout.strip().splitlines()[-1])
    except ValueError:
        return None
