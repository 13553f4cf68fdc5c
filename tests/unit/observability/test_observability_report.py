"""build_report: exact counts against the synthetic episodes, files written, empty store."""

from __future__ import annotations

import json
from collections import Counter
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from obs_synthetic import START, Synthetic, make_synthetic, write_synthetic

from observability.records import AlertRecord, RecordWriter, load_records
from observability.report import ReportSummary, alerts_frame, build_report, throughput

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ReportSummary]:
    # One report for the read-only tests: plotting is the slow part.
    base = tmp_path_factory.mktemp("report")
    write_synthetic(base / "records", make_synthetic())
    return base, build_report(base / "records", base / "report")


@pytest.fixture
def summary(built: tuple[Path, ReportSummary]) -> ReportSummary:
    return built[1]


def test_episode_counts_are_exact(summary: ReportSummary, synthetic: Synthetic) -> None:
    assert summary.message is None
    assert summary.episodes_total == len(synthetic.episodes)
    assert summary.episodes_by_outcome == dict(Counter(e.outcome for e in synthetic.episodes))
    assert summary.episodes_by_node == dict(Counter(e.node for e in synthetic.episodes))
    assert summary.steps_total == len(synthetic.steps)
    reasons = Counter((e.outcome, e.reason or "(none)") for e in synthetic.episodes)
    assert {(r.outcome, r.reason): r.count for r in summary.outcomes_by_reason} == reasons


def test_alert_counts_are_exact(summary: ReportSummary, synthetic: Synthetic) -> None:
    alerts = synthetic.alerts
    assert summary.alerts_total == len(alerts)
    assert summary.alerts_by_rule == dict(Counter(a.rule for a in alerts))
    assert summary.alerts_by_priority == dict(Counter(a.priority for a in alerts))
    assert summary.alerts_by_image == dict(Counter(a.image for a in alerts))
    assert summary.alerts_by_command == dict(Counter(a.proc_cmdline for a in alerts))


def test_counts_are_sorted_most_first(summary: ReportSummary) -> None:
    values = list(summary.alerts_by_rule.values())
    assert values == sorted(values, reverse=True)


def test_latency_percentiles_match_numpy(summary: ReportSummary, synthetic: Synthetic) -> None:
    samples = {
        "provision": [e.provision_s for e in synthetic.episodes],
        "step": [s.duration_s for s in synthetic.steps],
        "teardown": [e.teardown_s for e in synthetic.episodes],
        "total": [e.duration_s for e in synthetic.episodes],
    }
    for row in summary.latency:
        values = np.array(samples[row.phase], dtype=float)
        assert row.count == len(values)
        expected = np.percentile(values, [50, 90, 99])
        assert [row.p50, row.p90, row.p99] == pytest.approx(list(expected))


def test_throughput_counts_per_minute(records_dir: Path, synthetic: Synthetic) -> None:
    per_minute = throughput(load_records(records_dir).episodes)
    expected = Counter(
        (e.ended_at.replace(second=0, microsecond=0), e.outcome) for e in synthetic.episodes
    )
    got = {(r["minute"], r["outcome"]): r["count"] for r in per_minute.to_dicts()}
    assert got == dict(expected)


def test_plots_and_html_are_written(built: tuple[Path, ReportSummary]) -> None:
    base, summary = built
    out = base / "report"
    expected = {"throughput", "latency", "outcomes", "nodes", "alerts", "offenders"}
    assert {Path(p).stem for p in summary.plots} == expected
    for name in summary.plots:
        assert (out / name).read_bytes().startswith(PNG_MAGIC)
    page = (out / "index.html").read_text()
    assert summary.html == str(out / "index.html")
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert page.count('src="data:image/png;base64,') == len(expected)
    for title in ("Throughput", "Latency by phase", "Alerts by rule and priority"):
        assert title in page


def test_summary_is_json_for_the_cli(summary: ReportSummary) -> None:
    data = json.loads(summary.model_dump_json())
    assert data["episodes_total"] == summary.episodes_total
    assert ReportSummary.model_validate(data) == summary


def test_empty_store_gives_a_message(tmp_path: Path) -> None:
    summary = build_report(tmp_path / "nothing", tmp_path / "out")
    assert summary.episodes_total == 0 and summary.plots == []
    assert summary.message and "no episode records" in summary.message
    page = (tmp_path / "out" / "index.html").read_text()
    assert "no episode records" in page


def test_since_filters_episodes(records_dir: Path, synthetic: Synthetic, tmp_path: Path) -> None:
    since = START + timedelta(minutes=10)
    summary = build_report(records_dir, tmp_path / "late", since=since)
    assert summary.episodes_total == sum(e.started_at >= since for e in synthetic.episodes)
    assert summary.alerts_total == sum(a.time >= since for a in synthetic.alerts)
    future = build_report(records_dir, tmp_path / "future", since=START + timedelta(days=1))
    assert future.episodes_total == 0 and future.message and "since" in future.message


def test_alerts_come_from_episodes_when_no_alert_records(tmp_path: Path) -> None:
    data = make_synthetic(n=60, seed=3)
    data.alerts = []  # an episode-only writer
    write_synthetic(tmp_path / "rec", data)
    summary = build_report(tmp_path / "rec", tmp_path / "out")
    nested = [a for e in data.episodes for a in e.alerts]
    assert summary.alerts_total == len(nested)
    assert summary.alerts_by_rule == dict(Counter(a.rule for a in nested))
    assert summary.alerts_by_image == dict(
        Counter(e.image for e in data.episodes for _ in e.alerts)
    )


def test_alert_image_filled_from_episode(tmp_path: Path) -> None:
    data = make_synthetic(n=5, seed=1)
    episode = data.episodes[0]
    data.alerts = [
        AlertRecord(workflow_id=episode.workflow_id, rule="r", priority="Warning",
                    action="notify", time=START, proc_cmdline="<script>x</script>")
    ]  # fmt: skip
    write_synthetic(tmp_path / "rec", data)
    frame = alerts_frame(load_records(tmp_path / "rec"))
    assert frame["image"].to_list() == [episode.image]
    build_report(tmp_path / "rec", tmp_path / "out")
    page = (tmp_path / "out" / "index.html").read_text()
    assert "<script>x</script>" not in page and "&lt;script&gt;" in page


def test_single_episode_report(tmp_path: Path) -> None:
    data = make_synthetic(n=1, seed=2)
    with RecordWriter(tmp_path / "rec") as writer:
        writer.extend([e.model_copy(update={"alerts": []}) for e in data.episodes])
    summary = build_report(tmp_path / "rec", tmp_path / "out")
    assert summary.episodes_total == 1 and summary.steps_total == 0
    assert "alerts.png" not in summary.plots
    assert {r.phase: r.count for r in summary.latency}["step"] == 0
    assert summary.alerts_total == 0 and "no alerts" in Path(summary.html or "").read_text()
