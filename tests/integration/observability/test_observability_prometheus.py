"""A real Prometheus scrapes every Corral process; on-call's questions have answers.

Prometheus (Debian's `prometheus`) runs with the config `corral prometheus-config`
makes for the session stack; episodes end in different ways, one raises an
alert; Prometheus is then asked what a dashboard asks.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral import Corral, EpisodeFailed
from corral.ops.observe import stack_targets
from observability.prometheus import prometheus_yaml
from tests.integration.conftest import wait_for
from tests.net import free_port
from tests.unit.corral.test_corral_observability_files import DASHBOARD, dashboard_metrics
from workers.stack import Stack

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("prometheus") is None, reason="Debian's prometheus absent"),
]

NOTICE_RULE = "Write below etc in sandbox"  # notify: recorded, the episode goes on


@pytest.fixture
def prometheus(stack: Stack, tmp_path: Path) -> Iterator[str]:
    """Prometheus scraping the session stack every second; its HTTP API's base URL."""
    config = tmp_path / "prometheus.yml"
    config.write_text(prometheus_yaml(stack_targets(stack.config), interval_s=1))
    address = f"127.0.0.1:{free_port()}"
    log = (tmp_path / "prometheus.log").open("wb")
    data = tmp_path / "data"
    argv = [f"--config.file={config}", f"--storage.tsdb.path={data}", "--log.level=warn"]
    process = subprocess.Popen(
        ["prometheus", *argv, f"--web.listen-address={address}"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield f"http://{address}"
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


def _get(base: str, path: str, **params: str) -> Any:
    url = f"{base}{path}?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.loads(response.read())
    except OSError:
        return None  # not listening yet
    assert body["status"] == "success", body
    return body["data"]


def _by(base: str, query: str, label: str) -> dict[str, float]:
    """An instant query's samples, keyed by one label."""
    data = _get(base, "/api/v1/query", query=query) or {"result": []}
    return {s["metric"].get(label, ""): float(s["value"][1]) for s in data["result"]}


async def test_prometheus_sees_every_process_outcomes_and_alerts(
    corral: Corral, stack: Stack, prometheus: str
) -> None:
    async with await corral.start_episode({"image": "busybox"}) as noticed:
        await noticed.exec("echo x > /etc/corral-prometheus-note")

        async def alerted() -> bool:
            return NOTICE_RULE in (await noticed.status()).anomaly_rules

        await wait_for(alerted, timeout_s=60)
    with pytest.raises(EpisodeFailed):
        await corral.run_episode({"image": "busybox", "steps": ["exit 3"]})
    # The compiled sensor sees only sandboxes' events, so a node that ran
    # nothing this session has seen nothing: give each node one step.
    for node in stack.config.node_names():
        await corral.run_episode({"image": "busybox", "steps": ["true"]}, node=node)

    jobs = {t.job for t in stack_targets(stack.config)}

    async def all_up() -> bool:
        up = _by(prometheus, "min by (job) (up)", "job")
        return set(up) == jobs and all(v == 1 for v in up.values())

    await wait_for(all_up, timeout_s=90)

    async def outcomes_seen() -> bool:
        outcomes = _by(prometheus, "sum by (outcome) (corral_episodes_total)", "outcome")
        return outcomes.get("completed", 0) >= 1 and outcomes.get("failed", 0) >= 1

    await wait_for(outcomes_seen, timeout_s=60)
    alerts = _by(prometheus, "sum by (rule) (corral_alerts_total)", "rule")
    assert alerts.get(NOTICE_RULE, 0) >= 1
    delivered_query = 'sum by (rule) (corral_intake_alerts_total{status="delivered"})'
    delivered = _by(prometheus, delivered_query, "rule")
    assert delivered.get(NOTICE_RULE, 0) >= 1
    nodes = set(stack.config.node_names())

    async def every_sensor_saw_events() -> bool:
        query = 'sum by (node) (corral_sensor_events_total{kind="seen"})'
        seen = _by(prometheus, query, "node")
        return set(seen) == nodes and all(v > 0 for v in seen.values())

    await wait_for(every_sensor_saw_events, timeout_s=60)

    # Every metric the Grafana dashboard queries exists in this Prometheus.
    names = set(_get(prometheus, "/api/v1/label/__name__/values") or [])
    missing = dashboard_metrics(json.loads(DASHBOARD.read_text())) - names
    assert not missing, f"the dashboard queries metrics no process serves: {sorted(missing)}"
