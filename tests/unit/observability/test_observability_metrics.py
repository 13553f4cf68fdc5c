"""Metrics: served on a random local port, scraped back, summed by name."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from observability.metrics import (
    Metrics,
    parse_metrics,
    scrape,
    setup_metrics,
    temporal_runtime_with_prometheus,
)
from tests.net import free_port


@pytest.fixture
def metrics() -> Iterator[Metrics]:
    m = setup_metrics("corral-test-metrics", prometheus_port=0)
    yield m
    m.close()


def test_served_on_localhost_and_scraped(metrics: Metrics) -> None:
    assert metrics.port and metrics.url == f"http://127.0.0.1:{metrics.port}/metrics"
    metrics.record_provision(0.25, "node-a", "busybox")
    metrics.record_provision(0.75, "node-b", "busybox")
    metrics.record_exec(0.01, "node-a", "busybox")
    metrics.record_teardown(0.1, "node-a", "busybox")
    metrics.sandbox_added("node-a", "sb-1")
    metrics.sandbox_added("node-b", "sb-2", "idle")
    metrics.sandbox_moved("node-a", "sb-1", "paused")
    metrics.record_alert("Terminal shell in container", "kill")
    metrics.record_alert("Terminal shell in container", "kill")
    metrics.record_oom_kill("node-a")
    metrics.record_episode("completed")
    got = scrape(metrics.url or "")
    assert got["corral_provision_duration_seconds_count"] == 2
    assert got["corral_provision_duration_seconds_sum"] == pytest.approx(1.0)
    assert got["corral_exec_duration_seconds_count"] == 1
    assert got["corral_teardown_duration_seconds_count"] == 1
    assert got["corral_sandboxes"] == 2
    assert got["corral_alerts_total"] == 2
    assert got["corral_oom_kills_total"] == 1
    assert got["corral_episodes_total"] == 1
    assert not any(name.endswith("_bucket") for name in got)


def test_labels_are_on_the_page(metrics: Metrics) -> None:
    metrics.sandbox_added("node-a", "sb-1", "idle")
    metrics.sandbox_moved("node-a", "sb-1", "running")
    page = metrics.exposition()
    assert 'corral_sandboxes{node="node-a",' in page and 'state="running"' in page
    assert 'state="idle"' in page  # present, now at 0


def test_bad_sandbox_state_is_refused(metrics: Metrics) -> None:
    with pytest.raises(ValueError, match="frozen"):
        metrics.sandbox_added("node-a", "sb-1", "frozen")  # type: ignore[arg-type]


def _sandboxes(metrics: Metrics) -> dict[str, float]:
    """corral_sandboxes by state, read from the page."""
    return {
        s.labels["state"]: s.value
        for f in text_string_to_metric_families(metrics.exposition())
        for s in f.samples
        if s.name == "corral_sandboxes"
    }


def test_a_sandbox_killed_in_quarantine_leaves_paused_not_running(metrics: Metrics) -> None:
    metrics.sandbox_added("node-a", "sb-1")
    metrics.sandbox_added("node-a", "sb-2")
    metrics.sandbox_moved("node-a", "sb-1", "paused")
    metrics.sandbox_moved("node-a", "sb-1", "paused")  # a retried freeze moves nothing
    metrics.sandbox_removed("node-a", "sb-1")
    assert _sandboxes(metrics) == {"running": 1, "paused": 0}


def test_sandboxes_this_process_never_counted_do_not_drive_the_gauge_negative(
    metrics: Metrics,
) -> None:
    metrics.sandbox_added("node-a", "sb-1")
    metrics.sandbox_added("node-a", "sb-1")  # a retried provision found it again
    metrics.sandbox_moved("node-a", "sb-old", "paused")
    metrics.sandbox_removed("node-a", "sb-old")  # made before a worker restart
    assert _sandboxes(metrics) == {"running": 1}


def test_same_arguments_same_metrics(metrics: Metrics) -> None:
    assert setup_metrics("corral-test-metrics", prometheus_port=0) is metrics


def test_without_port_nothing_is_served() -> None:
    m = setup_metrics("corral-test-unserved", prometheus_port=None)
    try:
        assert m.port is None and m.url is None
        m.record_episode("failed")
        assert parse_metrics(m.exposition())["corral_episodes_total"] == 1
    finally:
        m.close()


def test_close_stops_serving() -> None:
    m = setup_metrics("corral-test-closing", prometheus_port=0)
    url = m.url or ""
    m.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=2)
    assert setup_metrics("corral-test-closing", prometheus_port=0) is not m
    setup_metrics("corral-test-closing", prometheus_port=0).close()


def test_parse_metrics_sums_by_sample_name() -> None:
    text = (
        "# TYPE corral_sandboxes gauge\n"
        'corral_sandboxes{node="a",state="idle"} 3\n'
        'corral_sandboxes{node="b",state="running"} 4\n'
        "# TYPE corral_alerts counter\n"
        'corral_alerts_total{rule="x"} 2\n'
    )
    assert parse_metrics(text) == {"corral_sandboxes": 7.0, "corral_alerts_total": 2.0}


def test_temporal_runtime_serves_prometheus() -> None:
    port = free_port()
    runtime = temporal_runtime_with_prometheus(port)
    assert runtime is not None
    # The core's endpoint answers before any client exists (possibly empty).
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        assert response.status == 200
