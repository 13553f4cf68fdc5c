"""`corral sim` as a user runs it: a small fleet, a tenth of it killed mid-run.

The sim starts its own control plane (Temporal, workflow worker, janitor) on
ports of its own (25233 + CORRAL_TEST_PORT_OFFSET), so it runs beside the
session and fleet stacks. Speed is not judged here (docs/benchmarks.md is
where figures go): the report's contract and that no episode is lost or stuck.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from corral.cli_sim import JSON_KEYS
from corral.sim import DEFAULT_PORT_BASE

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
_OFFSET = int(os.environ.get("CORRAL_TEST_PORT_OFFSET", "0"))


def _sim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "corral", "sim", "--port-base", str(DEFAULT_PORT_BASE + _OFFSET),
         *args],
        capture_output=True, text=True, cwd=REPO, timeout=600,
    )  # fmt: skip


def test_sim_with_a_tenth_of_the_nodes_killed_loses_no_episode() -> None:
    done = _sim("--nodes", "20", "--rate", "3", "--duration", "8", "--kill-fraction", "0.1",
                "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert set(JSON_KEYS) <= set(report)
    assert report["killed_nodes"] == 2
    assert report["started"] > 0
    assert report["lost"] == 0 and report["stuck"] == 0
    # Every episode has an answer: done, or failed naming its lost node.
    assert report["completed"] + report["failed_node_lost"] == report["started"]
    # Liveness is presence activities; signals are news only, far under the ceiling.
    assert report["max_signals_per_s_per_workflow"] < 10
    # The slowest placements are cut at their histories' events, and the cuts add up.
    assert report["slowest_gaps"], report["slowest_placements"]
    for gaps in report["slowest_gaps"]:
        parts = [v for k, v in gaps.items() if k.endswith("_ms") and k != "placement_ms"]
        # Two clocks meet (the sim's, the server's): a few ms of skew either way.
        assert min(parts) > -50 and abs(sum(parts) - gaps["placement_ms"]) < 5, gaps


def test_sim_refuses_a_bad_option_in_one_line() -> None:
    done = _sim("--nodes", "0")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1].startswith("Error: --nodes:")
