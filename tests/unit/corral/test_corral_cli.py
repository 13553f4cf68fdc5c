"""CLI helpers and one-line errors (no services needed)."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from contract.models import EpisodeResult
from corral.cli_common import shell_join
from corral.cli_episodes import batch_summary
from corral.cli_tools import parse_since

REPO = Path(__file__).resolve().parents[3]
CORRAL = [sys.executable, "-m", "corral"]


def test_shell_join_keeps_argv_and_shell_strings_apart() -> None:
    assert shell_join(("echo", "hi")) == ["echo", "hi"]
    assert shell_join(("echo hi | wc -c",)) == "echo hi | wc -c"
    assert shell_join(("ls",)) == ["ls"]


def test_parse_since_accepts_relative_and_iso_times() -> None:
    ago = parse_since("2h")
    assert ago is not None and datetime.now(UTC) - ago - timedelta(hours=2) < timedelta(seconds=5)
    assert parse_since("2026-01-01T00:00:00") == datetime(2026, 1, 1, tzinfo=UTC)
    assert parse_since(None) is None


def test_batch_summary_counts_outcomes_and_reasons() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    results = [
        EpisodeResult(
            episode_id=f"e{i}",
            outcome="completed" if i % 3 else "failed",
            reason="" if i % 3 else "step 0 `x` exited 1",
            started_at=start,
            ended_at=start + timedelta(seconds=i),
        )
        for i in range(1, 10)
    ]
    summary = batch_summary(results, wall_s=3.0)
    assert summary["episodes"] == 9
    assert summary["outcomes"] == {"completed": 6, "failed": 3}
    assert summary["failed_by_reason"] == {"step 0 `x` exited 1": 3}
    assert summary["p50_s"] == 5.0
    assert summary["per_second"] == 3.0


def assert_one_line_error(done: subprocess.CompletedProcess[str], message: str) -> None:
    """The command failed with exactly one error line, and it says `message`."""
    assert done.returncode != 0
    error_lines = [line for line in done.stderr.splitlines() if line.startswith("Error")]
    assert len(error_lines) == 1, done.stderr
    assert message in error_lines[0]


def run_cli(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": "/usr/bin:/bin",
        "CORRAL_STATE_DIR": str(tmp_path),
        "CORRAL_TEMPORAL_ADDRESS": "127.0.0.1:1",
    }
    return subprocess.run(
        [*CORRAL, *args], capture_output=True, text=True, cwd=REPO, env=env, timeout=60
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("episode", "start", "--step", "echo"), "give --image or a --spec file"),
        (("episode", "start", "--image", "busybox", "--step", ""), "steps.0.cmd"),
        (("episode", "list"), "cannot reach Temporal at 127.0.0.1:1"),
        (("policy", "explain", "No such rule"), "no rule named"),
        (("report", "--since", "yesterday"), "--since 'yesterday'"),
        (("bench", "--steps"), "is not up (temporal, containerd-node-1"),
    ],
)
def test_bad_input_gets_a_one_line_error(
    args: tuple[str, ...], message: str, tmp_path: Path
) -> None:
    assert_one_line_error(run_cli(*args, tmp_path=tmp_path), message)
