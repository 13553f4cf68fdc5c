"""The dev stack as a user drives it: up, status, demo, report, down.

A stack of its own (own ports and state directory), run through the real
`corral` command. After `down` no process, mount or shim of it may remain.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import corral, processes_of

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cli_env() -> Iterator[dict[str, str]]:
    state = Path(tempfile.mkdtemp(prefix="corral-e2e-", dir="/tmp"))
    # Below 32768, the kernel's ephemeral range, where outgoing connections take ports.
    offset = int(os.environ.get("CORRAL_TEST_PORT_OFFSET", "0"))
    env = {
        **os.environ,
        "CORRAL_STATE_DIR": str(state),
        "CORRAL_TEMPORAL_ADDRESS": f"127.0.0.1:{26233 + offset}",
        "CORRAL_TEMPORAL_UI_PORT": str(26333 + offset),
        "CORRAL_TEMPORAL_METRICS_PORT": str(26433 + offset),
        "CORRAL_METRICS_PORT_BASE": str(26460 + offset),
        "CORRAL_INTAKE_PORT": str(26765 + offset),
        "CORRAL_NODES": "1",
    }
    try:
        yield env
    finally:
        corral("down", env=env, check=False)


def test_up_status_demo_report_down(cli_env: dict[str, str]) -> None:
    state = cli_env["CORRAL_STATE_DIR"]
    up = corral("up", env=cli_env)
    assert f"Web UI: http://127.0.0.1:{cli_env['CORRAL_TEMPORAL_UI_PORT']}" in up.stdout
    assert "Web UI" in corral("up", env=cli_env).stdout  # harmless when already up

    status = json.loads(corral("status", "--json", env=cli_env).stdout)
    assert status["up"] is True
    names = {c["name"] for c in status["components"]}
    assert {"temporal", "containerd-node-1", "workflow-worker", "node-worker-node-1"} <= names

    demo = corral("demo", "--episodes", "5", env=cli_env)
    assert "completed" in demo.stdout and "failed" in demo.stdout  # the demo has a failing step

    # The report reads the records the episodes wrote (flushed within seconds).
    report = _report_when(cli_env, episodes=5)
    assert report["episodes_by_outcome"] == {"completed": 4, "failed": 1}
    assert Path(str(report["html"])).exists() and report["plots"]

    corral("down", env=cli_env)
    assert processes_of(state) == []
    mounts = [line for line in Path("/proc/mounts").read_text().splitlines() if state in line]
    assert mounts == []
    status_after = corral("status", "--json", env=cli_env, check=False)
    assert status_after.returncode != 0
    assert json.loads(status_after.stdout)["up"] is False


def _report_when(env: dict[str, str], episodes: int) -> dict[str, object]:
    import time

    deadline = time.monotonic() + 30
    while True:
        report: dict[str, object] = json.loads(corral("report", "--json", env=env).stdout)
        if report["episodes_total"] == episodes or time.monotonic() > deadline:
            assert report["episodes_total"] == episodes, report
            return report
        time.sleep(1)


def test_control_role_and_a_node_joined_by_name(cli_env: dict[str, str]) -> None:
    """`up --role control` starts no node; `node up --name` joins one; `node down`."""
    state = cli_env["CORRAL_STATE_DIR"]
    corral("up", "--role", "control", env=cli_env)
    status = json.loads(corral("status", "--json", env=cli_env).stdout)
    names = {c["name"] for c in status["components"]}
    assert {"temporal", "workflow-worker", "intake"} <= names
    assert not any(name.startswith(("containerd-", "node-worker-")) for name in names)

    joined = corral("node", "up", "--name", "edge-1", env=cli_env)
    assert "edge-1 is up" in joined.stdout
    # The first test's node-1 may still be listed (lost): same Temporal database.
    nodes = {n["heartbeat"]["name"]: n["state"] for n in _node_list(cli_env)}
    assert nodes["edge-1"] == "ready" and set(nodes) <= {"edge-1", "node-1"}

    # Drain and undrain are covered on the isolated rig (tests/integration/fleet).
    down = corral("node", "down", "edge-1", env=cli_env)
    assert "node-worker-edge-1" in down.stdout and "containerd-edge-1" in down.stdout
    assert not [p for p in processes_of(state) if "edge-1" in p]
    corral("down", env=cli_env)
    assert processes_of(state) == []


def _node_list(env: dict[str, str]) -> list[dict[str, Any]]:
    nodes: list[dict[str, Any]] = json.loads(corral("node", "list", "--json", env=env).stdout)
    return nodes
