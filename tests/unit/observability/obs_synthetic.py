"""Synthetic records for the observability tests: deterministic, with known counts.

A uniquely named module (not conftest) so `from obs_synthetic import ...`
cannot pick up another directory's conftest."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from observability.records import (
    AlertRecord,
    EpisodeAlert,
    EpisodeRecord,
    RecordWriter,
    StepRecord,
)

START = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
NODES = ("node-a", "node-b", "node-c")
IMAGES = ("busybox:corral", "debian:bookworm-agent", "python:3.11-agent")
COMMANDS = ("ls -la /", "python train.py", "cat /etc/shadow", "curl http://x", "pip install foo")
RULES = (
    ("Read sensitive file untrusted", "Warning", "notify"),
    ("Outbound connection from sandbox", "Notice", "quarantine"),
    ("Terminal shell in container", "Critical", "kill"),
    ("Drop and execute new binary in container", "Critical", "kill"),
)
OUTCOME_WEIGHTS = {
    "completed": 70,
    "failed": 10,
    "killed": 6,
    "quarantined": 3,
    "released": 3,
    "timed_out": 5,
    "cancelled": 3,
}
REASONS = {
    "failed": ("exit code 1", "reward command failed"),
    "killed": ("alert: Terminal shell in container",),
    "quarantined": ("alert: Outbound connection from sandbox",),
    "released": ("released by on-call",),
    "timed_out": ("episode timeout 600s",),
    "cancelled": ("cancelled by trainer",),
}


@dataclass
class Synthetic:
    episodes: list[EpisodeRecord] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    alerts: list[AlertRecord] = field(default_factory=list)


def _steps(rng: random.Random, wid: str, started: datetime, n: int) -> list[StepRecord]:
    return [
        StepRecord(
            workflow_id=wid,
            index=i,
            command=rng.choice(COMMANDS),
            exit_code=rng.choice((0, 0, 0, 1)),
            duration_s=rng.lognormvariate(-3.5, 0.8),
            timed_out=False,
            started_at=started + timedelta(seconds=0.5 + i),
        )
        for i in range(n)
    ]


def _alerts(rng: random.Random, wid: str, image: str, node: str, at: datetime) -> list[AlertRecord]:
    out = []
    for _ in range(rng.choice((0, 0, 0, 1, 2))):
        rule, priority, action = rng.choice(RULES)
        out.append(
            AlertRecord(
                workflow_id=wid,
                rule=rule,
                priority=priority,
                action=action,
                time=at,
                container_id=f"c-{wid}",
                proc_cmdline=rng.choice(COMMANDS),
                image=image,
                node=node,
            )
        )
    return out


def make_synthetic(n: int = 300, seed: int = 7, minutes: int = 20) -> Synthetic:
    rng = random.Random(seed)
    data = Synthetic()
    outcomes, weights = zip(*OUTCOME_WEIGHTS.items(), strict=True)
    for i in range(n):
        wid = f"episode-{i:05d}"
        started = START + timedelta(seconds=rng.uniform(0, minutes * 60))
        image, node = rng.choice(IMAGES), rng.choice(NODES)
        outcome = rng.choices(outcomes, weights)[0]
        steps = _steps(rng, wid, started, rng.randint(1, 6))
        alerts = _alerts(rng, wid, image, node, started + timedelta(seconds=1))
        provision, teardown = rng.lognormvariate(-1.2, 0.4), rng.lognormvariate(-2.5, 0.5)
        duration = provision + sum(s.duration_s for s in steps) + teardown + rng.uniform(0, 2)
        data.episodes.append(
            EpisodeRecord(
                workflow_id=wid,
                run_id=f"run-{i}",
                tenant="team-rl",
                image=image,
                node=node,
                spec_hash="abc123",
                started_at=started,
                ended_at=started + timedelta(seconds=duration),
                duration_s=duration,
                outcome=outcome,
                reason=rng.choice(REASONS[outcome]) if outcome in REASONS else None,
                reward=rng.random() if outcome == "completed" else None,
                steps=len(steps),
                provision_s=provision,
                teardown_s=teardown,
                alerts=[
                    EpisodeAlert(rule=a.rule, priority=a.priority, action=a.action, time=a.time)
                    for a in alerts
                ],
            )
        )
        data.steps.extend(steps)
        data.alerts.extend(alerts)
    return data


def write_synthetic(directory: Path, data: Synthetic, chunk: int = 97) -> None:
    """Write through a RecordWriter, flushing every `chunk` episodes so the
    store holds several part files per kind, as a long run would."""
    with RecordWriter(directory, flush_interval_s=3600) as writer:
        for start in range(0, len(data.episodes), chunk):
            episodes = data.episodes[start : start + chunk]
            ids = {e.workflow_id for e in episodes}
            writer.extend(list(episodes))
            writer.extend([s for s in data.steps if s.workflow_id in ids])
            writer.extend([a for a in data.alerts if a.workflow_id in ids])
            writer.flush()
