"""The shipped Prometheus config and Grafana dashboard (no services needed)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from contract.config import load_config
from corral.ops.observe import stack_targets
from observability.prometheus import prometheus_yaml

REPO = Path(__file__).resolve().parents[3]
DASHBOARD = REPO / "observability" / "grafana" / "corral.json"
SHIPPED = REPO / "observability" / "prometheus.yml"


def dashboard_metrics(dashboard: dict[str, Any]) -> set[str]:
    """The metric names the dashboard's queries read."""
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    return {name for e in exprs for name in re.findall(r"\b(corral_\w+|up)\b", e)}


def test_the_shipped_prometheus_config_is_the_default_stacks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for key in [k for k in os.environ if k.startswith("CORRAL_")]:
        monkeypatch.delenv(key)
    config = load_config(REPO / "temporal-dev.yaml")
    assert SHIPPED.read_text() == prometheus_yaml(stack_targets(config))


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian prometheus) absent")
def test_promtool_accepts_the_shipped_config() -> None:
    done = subprocess.run(["promtool", "check", "config", str(SHIPPED)], capture_output=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_dashboard_is_a_well_formed_grafana_dashboard() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["title"] and dashboard["uid"] and dashboard["schemaVersion"] >= 36
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        assert panel["type"] in ("timeseries", "stat", "table"), panel["title"]
        assert panel["datasource"]["type"] == "prometheus"
        assert set(panel["gridPos"]) == {"x", "y", "w", "h"}
        assert panel["targets"] and all(t["expr"] and t["refId"] for t in panel["targets"])
    assert {"corral_episodes_total", "corral_alerts_total"} <= dashboard_metrics(dashboard)
