"""`corral run` as a trainer types it: a batch from a spec file to a Parquet file.

A one-node stack of its own (own ports and state directory), driven through
the real `corral` command: up, run (summary and Parquet checked), episode
start/list/kill through the CLI, down. Nothing of the stack may remain.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
from cli_helpers import corral, processes_of

from contract.models import EpisodeResult
from tests.net import listening

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run_env() -> Iterator[dict[str, str]]:
    state = Path(tempfile.mkdtemp(prefix="corral-e2e-run-", dir="/tmp"))
    env = {
        **os.environ,
        **_free_ports(),
        "CORRAL_STATE_DIR": str(state),
        "CORRAL_NODES": "1",
        "CORRAL_WARM_POOL": "",
    }
    corral("up", env=env)
    try:
        yield env
    finally:
        corral("down", env=env, check=False)
        leftover = [p for p in processes_of(str(state))]
        assert leftover == [], leftover


def _free_ports() -> dict[str, str]:
    """This module's port family (30233... + the test offset), like the other e2e
    stacks' (24233 TLS, 26233 stack, 28233 Web UI): below 32768, the kernel's
    ephemeral range, where a client's outgoing connection could take one first."""
    base = 30000 + int(os.environ.get("CORRAL_TEST_PORT_OFFSET", "0"))
    ports = {
        "CORRAL_TEMPORAL_UI_PORT": base + 333,
        "CORRAL_TEMPORAL_METRICS_PORT": base + 433,
        "CORRAL_METRICS_PORT_BASE": base + 460,
        "CORRAL_INTAKE_PORT": base + 765,
    }
    probe = [*ports.values(), *range(base + 233, base + 240), *range(base + 460, base + 466)]
    busy = [port for port in probe if listening(port)]
    assert not busy, f"ports {busy} are taken: set CORRAL_TEST_PORT_OFFSET to a free family"
    return {"CORRAL_TEMPORAL_ADDRESS": f"127.0.0.1:{base + 233}"} | {
        key: str(port) for key, port in ports.items()
    }


def test_run_batch_writes_summary_and_parquet(run_env: dict[str, str], tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "image: busybox\n"
        "steps:\n"
        "  - echo hello\n"
        "  - test $(( $(cat /proc/sys/kernel/random/uuid | tr -dc 0-9 | head -c 3) % 5 )) -ne 0\n"
        "reward: echo 1.0\n"
    )
    out = tmp_path / "results" / "batch.parquet"
    done = corral(
        "run",
        "--spec",
        str(spec),
        "--episodes",
        "20",
        "--concurrency",
        "5",
        "--out",
        str(out),
        "--json",
        env=run_env,
    )
    summary = json.loads(done.stdout)
    assert summary["episodes"] == 20
    assert sum(summary["outcomes"].values()) == 20
    assert set(summary["outcomes"]) <= {"completed", "failed", "killed"}
    failed = summary["outcomes"].get("failed", 0)
    assert sum(summary["failed_by_reason"].values()) == failed
    assert all("step 1" in reason for reason in summary["failed_by_reason"]), summary[
        "failed_by_reason"
    ]
    assert summary["per_second"] > 0 and summary["p50_s"] <= summary["p99_s"]
    assert summary["results_file"] == str(out)

    frame = pl.read_parquet(out)
    assert frame.height == 20 and frame["episode_id"].n_unique() == 20
    assert {
        "episode_id",
        "outcome",
        "reason",
        "node",
        "steps",
        "duration_s",
        "reward_exit_code",
        "alerts",
        "result_json",
    } <= set(frame.columns)
    assert dict(frame["outcome"].value_counts().iter_rows()) == summary["outcomes"]
    for row in frame.iter_rows(named=True):
        result = EpisodeResult.model_validate_json(row["result_json"])
        assert result.episode_id == row["episode_id"] and result.node == "node-1"
        if row["outcome"] == "completed":
            assert row["reward_exit_code"] == 0 and result.steps[0].stdout == "hello\n"

    # The human summary (no --json) names the outcomes and the file.
    human = corral(
        "run",
        "--spec",
        str(spec),
        "--episodes",
        "2",
        "--out",
        str(tmp_path / "b.parquet"),
        env=run_env,
    )
    assert "2 episodes" in human.stdout and "b.parquet" in human.stdout

    left = corral("status", "--json", env=run_env)
    detail = {c["name"]: c["detail"] for c in json.loads(left.stdout)["components"]}
    assert detail["containerd-node-1"].endswith(" 0 sandboxes"), detail


def test_run_rejects_bad_spec_with_one_line(run_env: dict[str, str], tmp_path: Path) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("image: busybox\ntimeouts: {step_sec: 3}\n")
    done = corral("run", "--spec", str(spec), "--episodes", "2", env=run_env, check=False)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "step_sec" in lines[0], done.stderr


def test_episode_cli_start_list_kill(run_env: dict[str, str]) -> None:
    started = corral(
        "episode", "start", "--image", "busybox", "--interactive", "--json", env=run_env
    )
    episode_id = json.loads(started.stdout)["episode_id"]
    ran = corral("episode", "exec", episode_id, "--json", "--", "echo", "hi", env=run_env)
    assert json.loads(ran.stdout)["stdout"] == "hi\n"
    corral("episode", "kill", episode_id, "--reason", "e2e", env=run_env)
    shown = corral("episode", "show", episode_id, "--json", env=run_env)
    result = EpisodeResult.model_validate_json(shown.stdout)
    assert result.outcome == "killed" and "e2e" in result.reason


def temporal(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The `temporal` CLI against this stack, as docs/trajectories.md shows it."""
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "temporal"),
            *args,
            "--address",
            env["CORRAL_TEMPORAL_ADDRESS"],
            "--namespace",
            "corral",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, f"temporal {' '.join(args)}:\n{done.stderr}"
    return done


def test_on_call_names_through_the_temporal_cli(run_env: dict[str, str]) -> None:
    started = corral(
        "episode", "start", "--image", "busybox", "--interactive", "--json", env=run_env
    )
    wid = json.loads(started.stdout)["episode_id"]
    ran = temporal(
        "workflow",
        "update",
        "execute",
        "--workflow-id",
        wid,
        "--name",
        "exec",
        "--input",
        '{"cmd": "echo from-cli"}',
        "-o",
        "json",
        env=run_env,
    )
    assert "from-cli" in ran.stdout
    temporal(
        "workflow",
        "update",
        "execute",
        "--workflow-id",
        wid,
        "--name",
        "write_file",
        "--input",
        '{"path": "/tmp/note", "content_b64": "aGkK"}',
        env=run_env,
    )
    read = temporal(
        "workflow",
        "update",
        "execute",
        "--workflow-id",
        wid,
        "--name",
        "read_file",
        "--input",
        '{"path": "/tmp/note"}',
        "-o",
        "json",
        env=run_env,
    )
    assert "aGkK" in read.stdout
    status = temporal(
        "workflow", "query", "--workflow-id", wid, "--name", "status", "-o", "json", env=run_env
    )
    assert '"running"' in status.stdout
    steps = temporal(
        "workflow", "query", "--workflow-id", wid, "--name", "steps", "-o", "json", env=run_env
    )
    assert "echo from-cli" in steps.stdout
    temporal(
        "workflow",
        "signal",
        "--workflow-id",
        wid,
        "--name",
        "kill",
        "--input",
        '{"reason": "from the cli", "by": "oncall"}',
        env=run_env,
    )
    shown = corral("episode", "show", wid, "--json", env=run_env)
    result = EpisodeResult.model_validate_json(shown.stdout)
    assert (
        result.outcome == "killed" and result.reason == "killed by on-call by oncall: from the cli"
    )
    history = temporal("workflow", "show", "--workflow-id", wid, "--output", "json", env=run_env)
    assert "corral.exec_step" in history.stdout
    assert "SIGNALED" in history.stdout.upper()
