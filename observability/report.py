"""`corral report`: polars analysis of the records store, PNG plots and an HTML page.

The analysis functions are pure (frames in, frames out) so tests can check the
numbers without plotting; `build_report` glues them to the plots and the page.
"""

from __future__ import annotations

import base64
import html
from datetime import UTC, datetime
from pathlib import Path

import polars as pl

from observability import plots
from observability.records import OUTCOMES, Records, load_records
from observability.report_models import OutcomeReason, PhaseLatency, ReportSummary

__all__ = [
    "OutcomeReason",
    "PhaseLatency",
    "ReportSummary",
    "alerts_by_rule",
    "alerts_frame",
    "build_report",
    "latency_table",
    "load_per_node",
    "outcomes_by_reason",
    "throughput",
    "top_offenders",
]

PHASES = ("provision", "step", "teardown", "total")
NO_REASON = "(none)"
UNKNOWN = "(unknown)"
TOP_N = 10


# --------------------------------------------------------------------------- #
# Analysis
# --------------------------------------------------------------------------- #


def _since(records: Records, since: datetime | None) -> Records:
    if since is None:
        return records
    at = since if since.tzinfo else since.replace(tzinfo=UTC)
    return Records(
        episodes=records.episodes.filter(pl.col("started_at") >= at),
        steps=records.steps.filter(pl.col("started_at") >= at),
        alerts=records.alerts.filter(pl.col("time") >= at),
    )


def throughput(episodes: pl.DataFrame) -> pl.DataFrame:
    """Episodes ended per minute and outcome: minute, outcome, count."""
    return (
        episodes.with_columns(pl.col("ended_at").dt.truncate("1m").alias("minute"))
        .group_by("minute", "outcome")
        .agg(pl.len().alias("count"))
        .sort("minute", "outcome")
    )


def _percentiles(phase: str, values: pl.Series) -> PhaseLatency:
    v = values.drop_nulls()
    if v.is_empty():
        return PhaseLatency(phase=phase, count=0, p50=None, p90=None, p99=None)

    def q(x: float) -> float:
        return float(v.quantile(x, interpolation="linear") or 0.0)

    return PhaseLatency(phase=phase, count=v.len(), p50=q(0.5), p90=q(0.9), p99=q(0.99))


def latency_table(records: Records) -> list[PhaseLatency]:
    """p50/p90/p99 in seconds of provision, each step, teardown and whole episodes."""
    e = records.episodes
    series = {
        "provision": e["provision_s"],
        "step": records.steps["duration_s"],
        "teardown": e["teardown_s"],
        "total": e["duration_s"],
    }
    return [_percentiles(phase, series[phase]) for phase in PHASES]


def outcomes_by_reason(episodes: pl.DataFrame) -> pl.DataFrame:
    return (
        episodes.with_columns(pl.col("reason").fill_null(NO_REASON))
        .group_by("outcome", "reason")
        .agg(pl.len().alias("count"))
        .sort(["count", "outcome", "reason"], descending=[True, False, False])
    )


def load_per_node(episodes: pl.DataFrame) -> pl.DataFrame:
    """Episodes per node and outcome: node, outcome, count."""
    return (
        episodes.with_columns(pl.col("node").fill_null(UNKNOWN))
        .group_by("node", "outcome")
        .agg(pl.len().alias("count"))
        .sort("node", "outcome")
    )


def _nested_alerts(episodes: pl.DataFrame) -> pl.DataFrame:
    # Episodes carry their alerts too; used only when no AlertRecords were
    # written, so an episode-only writer still gets alert tables.
    return (
        episodes.select("workflow_id", "image", "node", "alerts")
        .explode("alerts")
        .drop_nulls("alerts")
        .unnest("alerts")
        .with_columns(
            pl.lit(None, pl.String).alias("container_id"),
            pl.lit(None, pl.String).alias("proc_cmdline"),
        )
    )


def alerts_frame(records: Records) -> pl.DataFrame:
    """One row per alert, with image and node filled from its episode if missing."""
    if records.alerts.is_empty():
        alerts = _nested_alerts(records.episodes).select(records.alerts.columns)
        return alerts.cast(records.alerts.schema)
    episode_info = records.episodes.select(
        "workflow_id", pl.col("image").alias("_image"), pl.col("node").alias("_node")
    ).unique("workflow_id")
    return (
        records.alerts.join(episode_info, on="workflow_id", how="left")
        .with_columns(
            pl.coalesce("image", "_image").alias("image"),
            pl.coalesce("node", "_node").alias("node"),
        )
        .drop("_image", "_node")
    )


def alerts_by_rule(alerts: pl.DataFrame) -> pl.DataFrame:
    """rule, priority, count, sorted by count."""
    return (
        alerts.group_by("rule", "priority")
        .agg(pl.len().alias("count"))
        .sort(["count", "rule", "priority"], descending=[True, False, False])
    )


def top_offenders(alerts: pl.DataFrame, column: str, n: int = TOP_N) -> pl.DataFrame:
    """The `n` values of `column` (image, proc_cmdline) with the most alerts."""
    return (
        alerts.with_columns(pl.col(column).fill_null(UNKNOWN))
        .group_by(column)
        .agg(
            pl.len().alias("alerts"),
            pl.col("workflow_id").n_unique().alias("episodes"),
            pl.col("rule").unique().sort().str.join(", ").alias("rules"),
        )
        .sort(["alerts", column], descending=[True, False])
        .head(n)
    )


def _counts(df: pl.DataFrame, key: str, value: str = "count") -> dict[str, int]:
    grouped = df.group_by(key).agg(pl.col(value).sum()).sort(value, key, descending=[True, False])
    return {str(k): int(v) for k, v in grouped.iter_rows()}


# --------------------------------------------------------------------------- #
# The report
# --------------------------------------------------------------------------- #


def _empty_message(records_dir: Path, since: datetime | None) -> str:
    where = f"no episode records under {records_dir}"
    return f"{where} since {since.isoformat()}" if since else f"{where} (run some episodes first)"


def _summarize(records: Records, alerts: pl.DataFrame, summary: ReportSummary) -> ReportSummary:
    e = records.episodes
    per_minute = throughput(e)
    completed = per_minute.filter(pl.col("outcome") == "completed")["count"]
    minutes = per_minute["minute"].n_unique()
    return summary.model_copy(
        update={
            "window_start": e["started_at"].min(),
            "window_end": e["ended_at"].max(),
            "episodes_total": e.height,
            "episodes_by_outcome": _counts(e.group_by("outcome").agg(pl.len()), "outcome", "len"),
            "outcomes_by_reason": [OutcomeReason(**r) for r in outcomes_by_reason(e).to_dicts()],
            "episodes_by_node": _counts(load_per_node(e), "node"),
            "completed_per_minute": float(completed.sum()) / minutes if minutes else None,
            "steps_total": records.steps.height,
            "alerts_total": alerts.height,
            "alerts_by_rule": _counts(alerts_by_rule(alerts), "rule"),
            "alerts_by_priority": _counts(alerts_by_rule(alerts), "priority"),
            "alerts_by_image": _counts(
                top_offenders(alerts, "image", alerts.height), "image", "alerts"
            ),
            "alerts_by_command": _counts(
                top_offenders(alerts, "proc_cmdline", TOP_N), "proc_cmdline", "alerts"
            ),
            "latency": latency_table(records),
        }
    )


def _draw(records: Records, alerts: pl.DataFrame, out_dir: Path) -> dict[str, Path]:
    e = records.episodes
    drawn = {
        "throughput": plots.throughput(throughput(e), out_dir / "throughput.png"),
        "latency": plots.latency(latency_table(records), out_dir / "latency.png"),
        "outcomes": plots.outcomes(outcomes_by_reason(e), out_dir / "outcomes.png"),
        "nodes": plots.nodes(load_per_node(e), out_dir / "nodes.png"),
        "alerts": plots.alerts(alerts_by_rule(alerts), out_dir / "alerts.png"),
        "offenders": plots.offenders(
            top_offenders(alerts, "image"), top_offenders(alerts, "proc_cmdline"),
            out_dir / "offenders.png",
        ),
    }  # fmt: skip
    return {name: path for name, path in drawn.items() if path is not None}


def build_report(records_dir: Path, out_dir: Path, since: datetime | None = None) -> ReportSummary:
    """Analyse `records_dir`, write PNGs and `index.html` into `out_dir`.

    An empty store (or nothing since `since`) is not an error: the summary's
    `message` says so, counts are zero, and the page shows the message.
    """
    records_dir, out_dir = Path(records_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    records = _since(load_records(records_dir), since)
    summary = ReportSummary(
        records_dir=str(records_dir),
        out_dir=str(out_dir),
        generated_at=datetime.now(UTC),
        since=since,
    )
    if records.episodes.is_empty():
        summary.message = _empty_message(records_dir, since)
        summary.html = str(_write_html(out_dir, summary, records, {}))
        return summary
    alerts = alerts_frame(records)
    summary = _summarize(records, alerts, summary)
    drawn = _draw(records, alerts, out_dir)
    summary.plots = [p.name for p in drawn.values()]
    summary.html = str(_write_html(out_dir, summary, records, drawn, alerts))
    return summary


# --------------------------------------------------------------------------- #
# HTML
# --------------------------------------------------------------------------- #

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto;
       max-width: 1100px; color: #1f2933; padding: 0 1rem; }
h1 { margin-bottom: 0.2rem; } .sub { color: #616e7c; margin-top: 0; }
.cards { display: flex; gap: 1rem; flex-wrap: wrap; margin: 1.5rem 0; }
.card { border: 1px solid #d9e2ec; border-radius: 8px; padding: 0.8rem 1.2rem; min-width: 9rem; }
.card .n { font-size: 1.8rem; font-weight: 600; } .card .l { color: #616e7c; }
section { margin: 2.5rem 0; } img { max-width: 100%; border: 1px solid #eef2f6; }
table { border-collapse: collapse; margin-top: 0.8rem; font-size: 0.92rem; }
th, td { border-bottom: 1px solid #e4e7eb; padding: 0.35rem 0.8rem; text-align: left; }
th { background: #f5f7fa; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
code { font-size: 0.85rem; } .empty { padding: 2rem; background: #fff8e1; border-radius: 8px; }
"""


def _cell(value: object) -> str:
    if isinstance(value, datetime):
        return f"<td>{value:%Y-%m-%d %H:%M}</td>"
    if isinstance(value, float):
        return f'<td class="num">{value:.4g}</td>'
    if isinstance(value, int) and not isinstance(value, bool):
        return f'<td class="num">{value}</td>'
    text = "" if value is None else str(value)
    return f"<td>{html.escape(text)}</td>"


def _table(df: pl.DataFrame, empty: str = "none") -> str:
    if df.is_empty():
        return f"<p>{html.escape(empty)}</p>"
    head = "".join(f"<th>{html.escape(c)}</th>" for c in df.columns)
    rows = "".join("<tr>" + "".join(_cell(v) for v in row) + "</tr>" for row in df.iter_rows())
    return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def _img(path: Path | None, alt: str) -> str:
    if path is None:
        return ""
    # Embedded, so index.html is one file that can be mailed or attached.
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img src="data:image/png;base64,{data}" alt="{html.escape(alt)}">'


def _cards(summary: ReportSummary) -> str:
    figures = [
        (summary.episodes_total, "episodes"),
        (summary.episodes_by_outcome.get("completed", 0), "completed"),
        (summary.steps_total, "steps"),
        (summary.alerts_total, "alerts"),
        (len(summary.episodes_by_node), "nodes"),
    ]
    body = "".join(
        f'<div class="card"><div class="n">{n}</div><div class="l">{label}</div></div>'
        for n, label in figures
    )
    return f'<div class="cards">{body}</div>'


def _latency_df(summary: ReportSummary) -> pl.DataFrame:
    rows = [r.model_dump() for r in summary.latency]
    return pl.DataFrame(rows).rename({"p50": "p50 (s)", "p90": "p90 (s)", "p99": "p99 (s)"})


MAX_MINUTE_ROWS = 60


def _by_outcome(df: pl.DataFrame, index: str) -> pl.DataFrame:
    """Wide table: one row per `index`, a column per outcome (in OUTCOMES order), a total."""
    wide = df.pivot("outcome", index=index, values="count").fill_null(0).sort(index)
    outcomes = [o for o in OUTCOMES if o in wide.columns]
    return wide.select(index, *outcomes).with_columns(pl.sum_horizontal(outcomes).alias("total"))


def _sections(
    summary: ReportSummary, records: Records, drawn: dict[str, Path], alerts: pl.DataFrame
) -> list[tuple[str, str, str]]:
    e = records.episodes
    # A long run has thousands of minutes; the plot shows them all, the table the last hour.
    per_minute = _by_outcome(throughput(e), "minute").tail(MAX_MINUTE_ROWS)
    return [
        ("Throughput", _img(drawn.get("throughput"), "throughput"), _table(per_minute)),
        ("Latency by phase", _img(drawn.get("latency"), "latency"), _table(_latency_df(summary))),
        ("Outcomes by reason", _img(drawn.get("outcomes"), "outcomes"),
         _table(outcomes_by_reason(e))),
        ("Load per node", _img(drawn.get("nodes"), "nodes"),
         _table(_by_outcome(load_per_node(e), "node"))),
        ("Alerts by rule and priority", _img(drawn.get("alerts"), "alerts"),
         _table(alerts_by_rule(alerts), "no alerts")),
        ("Images and commands with the most alerts", _img(drawn.get("offenders"), "offenders"),
         _table(top_offenders(alerts, "image"), "no alerts")
         + _table(top_offenders(alerts, "proc_cmdline"), "")),
    ]  # fmt: skip


def _write_html(
    out_dir: Path,
    summary: ReportSummary,
    records: Records,
    drawn: dict[str, Path],
    alerts: pl.DataFrame | None = None,
) -> Path:
    when = summary.generated_at.strftime("%Y-%m-%d %H:%M:%S UTC")
    window = ""
    if summary.window_start and summary.window_end:
        start, end = summary.window_start, summary.window_end
        window = f" · episodes from {start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>Corral report</title><style>{CSS}</style></head><body>",
        "<h1>Corral report</h1>",
        f'<p class="sub">{html.escape(summary.records_dir)} · generated {when}{window}</p>',
    ]
    if summary.message:
        parts.append(f'<div class="empty">{html.escape(summary.message)}</div>')
    else:
        parts.append(_cards(summary))
        for title, img, table in _sections(
            summary, records, drawn, alerts if alerts is not None else records.alerts
        ):
            parts.append(f"<section><h2>{html.escape(title)}</h2>{img}{table}</section>")
    parts.append("</body></html>")
    path = out_dir / "index.html"
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
