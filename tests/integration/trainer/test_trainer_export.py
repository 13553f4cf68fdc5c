"""`corral export`: what a training pipeline reads back, from the real stack."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pytest

from corral import Corral
from corral.export import TrajectoryRow, export_trajectories
from tests.e2e.cli_helpers import corral as run_cli
from tests.integration.conftest import wait_for

pytestmark = pytest.mark.integration

NOTICE_RULE = "Write below etc in sandbox"  # notify only: the episode goes on
SPEC = {
    "image": "busybox",
    "labels": {"task": "export-test"},
    "steps": ["echo scripted"],
    "interactive": True,
    "reward": "echo 0.5",
}


async def _exported(corral: Corral, since: datetime, episode_id: str) -> TrajectoryRow:
    found: list[TrajectoryRow] = []

    async def listed() -> bool:  # visibility catches up with the close
        found[:] = [
            r for r in await export_trajectories(corral, since) if r.episode_id == episode_id
        ]
        return bool(found)

    await wait_for(listed)
    return found[0]


async def test_export_holds_actions_observations_rewards_and_alerts(
    corral: Corral, tmp_path: Path
) -> None:
    since = datetime.now(UTC)
    async with await corral.start_episode(SPEC) as episode:
        await episode.exec("echo note > /etc/corral-export-note")

        async def alerted() -> bool:
            return NOTICE_RULE in (await episode.status()).anomaly_rules

        await wait_for(alerted, timeout_s=60)
        await episode.exec("echo failing; exit 3")

    row = await _exported(corral, since, episode.id)
    assert (row.outcome, row.reward, row.labels) == ("completed", 0.5, {"task": "export-test"})
    actions = [s for s in row.steps if s.source != "reward"]
    assert [(s.source, s.action, s.exit_code) for s in actions] == [
        ("scripted", "echo scripted", 0),
        ("interactive", "echo note > /etc/corral-export-note", 0),
        ("interactive", "echo failing; exit 3", 3),
    ]
    assert actions[0].observation == "scripted\n" and actions[2].observation == "failing\n"
    assert NOTICE_RULE in actions[1].alerts and NOTICE_RULE in row.alerts
    assert all(s.started_at is not None and s.duration_s > 0 for s in row.steps)

    out = tmp_path / "trajectories.parquet"
    args = ["--since", since.isoformat(), "--format", "parquet", "--out", str(out), "--json"]
    done = run_cli("export", *args, env=os.environ.copy())  # the session stack's settings
    assert json.loads(done.stdout)["episodes"] >= 1
    frame = pl.read_parquet(out).filter(pl.col("episode_id") == episode.id)
    steps = frame["steps"][0]
    assert [s["exit_code"] for s in steps if s["source"] != "reward"] == [0, 0, 3]
    assert frame["reward"][0] == 0.5 and frame["outcome"][0] == "completed"


def test_export_refuses_parquet_to_standard_output() -> None:
    done = run_cli("export", "--format", "parquet", env=os.environ.copy(), check=False)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == "Error: --format parquet needs --out FILE"
