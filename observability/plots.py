"""The report's PNG plots.

Built on `matplotlib.figure.Figure` (the Agg canvas), never pyplot: no global
figure state, no GUI backend, safe from worker threads. Each function returns
the path written, or None when there is nothing to draw.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib
import matplotlib.dates as mdates
import matplotlib.ticker
import numpy as np
import polars as pl
from matplotlib.axes import Axes
from matplotlib.figure import Figure

if TYPE_CHECKING:
    from observability.report_models import PhaseLatency

STYLE: dict[Any, Any] = {
    "font.size": 11,
    "axes.titlesize": 14,
    "axes.titleweight": "bold",
    "axes.labelsize": 12,
    "xtick.labelsize": 10,
    "ytick.labelsize": 10,
    "legend.fontsize": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.axisbelow": True,
}
DPI = 110

# Stable colours so one outcome looks the same in every plot.
OUTCOME_COLORS = {
    "completed": "#2e7d32",
    "failed": "#c62828",
    "killed": "#6a1b9a",
    "quarantined": "#ef6c00",
    "released": "#0277bd",
    "timed_out": "#8d6e63",
    "cancelled": "#78909c",
}
OUTCOME_ORDER = list(OUTCOME_COLORS)
# Falco priorities, most to least severe, hot to cold.
PRIORITY_COLORS = {
    "Emergency": "#4a0000",
    "Alert": "#8b0000",
    "Critical": "#c62828",
    "Error": "#ef6c00",
    "Warning": "#f9a825",
    "Notice": "#1e88e5",
    "Informational": "#64b5f6",
    "Debug": "#b0bec5",
}
PHASE_COLORS = ("#90caf9", "#1e88e5", "#0d47a1")  # p50, p90, p99


@contextmanager
def _figure(path: Path, width: float, height: float) -> Iterator[Figure]:
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
        yield fig
        fig.savefig(path, dpi=DPI, facecolor="white")


def _ordered(values: Sequence[str], order: Sequence[str]) -> list[str]:
    known = [v for v in order if v in values]
    return known + sorted(v for v in values if v not in order)


def _color(mapping: dict[str, str], key: str, fallback: str = "#9e9e9e") -> str:
    return mapping.get(key, fallback)


def _shorten(text: str, limit: int = 48) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _integer_axis(ax: Axes, axis: str = "y") -> None:
    locator = matplotlib.ticker.MaxNLocator(integer=True)
    (ax.yaxis if axis == "y" else ax.xaxis).set_major_locator(locator)


def throughput(per_minute: pl.DataFrame, path: Path) -> Path | None:
    """Stacked bars: episodes ended per minute, by outcome."""
    if per_minute.is_empty():
        return None
    wide = per_minute.pivot("outcome", index="minute", values="count").fill_null(0).sort("minute")
    minutes = wide["minute"].to_list()
    outcomes = _ordered([c for c in wide.columns if c != "minute"], OUTCOME_ORDER)
    with _figure(path, 10, 4.8) as fig:
        ax = fig.add_subplot()
        bottom = np.zeros(len(minutes))
        # Each bar starts at its minute and fills 80% of it (date units are days).
        width = 0.8 / (24 * 60)
        for outcome in outcomes:
            counts = wide[outcome].to_numpy().astype(float)
            ax.bar(minutes, counts, width=width, bottom=bottom, label=outcome, align="edge",
                   color=_color(OUTCOME_COLORS, outcome))  # fmt: skip
            bottom += counts
        _minute_axis(ax, minutes)
        ax.set_title("Episodes finished per minute")
        ax.set_xlabel("minute (UTC)")
        ax.set_ylabel("episodes")
        _integer_axis(ax)
        ax.legend(title="outcome", loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return path


def _minute_axis(ax: Axes, minutes: list[datetime]) -> None:
    # Pad by a minute each side: with one or two minutes of data the default
    # limits zoom into a single bar and repeat the same tick label.
    pad = timedelta(minutes=1)
    first, last = min(minutes), max(minutes)
    ax.set_xlim(first - pad, last + 2 * pad)  # type: ignore[arg-type]
    short = last - first <= timedelta(minutes=12)
    # Ticks on whole minutes for short runs: the bins are minutes, sub-minute
    # ticks would suggest a resolution the data does not have.
    locator: mdates.DateLocator = (
        mdates.MinuteLocator() if short else mdates.AutoDateLocator(minticks=3, maxticks=10)
    )
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, show_offset=True))


def latency(table: Sequence[PhaseLatency], path: Path) -> Path | None:
    """Grouped bars of p50/p90/p99 per phase, on a log axis (ms to minutes)."""
    rows = [r for r in table if r.count > 0]
    if not rows:
        return None
    x = np.arange(len(rows))
    width = 0.26
    with _figure(path, 10, 5) as fig:
        ax = fig.add_subplot()
        for i, (q, color) in enumerate(zip(("p50", "p90", "p99"), PHASE_COLORS, strict=True)):
            values = [getattr(r, q) or 0.0 for r in rows]
            bars = ax.bar(x + (i - 1) * width, values, width, label=q, color=color)
            ax.bar_label(bars, labels=[_seconds(v) for v in values], fontsize=8, padding=2)
        ax.set_xticks(x, [f"{r.phase}\n(n={r.count})" for r in rows])
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: _seconds(v)))
        ax.set_ylabel("duration (log scale)")
        ax.set_title("Latency percentiles by phase")
        ax.legend(frameon=False, ncols=3, loc="upper left")
        ax.margins(y=0.15)
    return path


def _seconds(value: float) -> str:
    if value <= 0:
        return ""
    if value < 0.001:
        return f"{value * 1e6:.0f} µs"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.3g} s"


def _totals(ax: Axes, positions: Sequence[object], totals: np.ndarray, horizontal: bool) -> None:
    """Label each stacked bar with its total and leave room for the label."""
    for pos, total in zip(positions, totals, strict=True):
        if horizontal:
            ax.annotate(f"{total:.0f}", (total, pos), xytext=(3, 0), textcoords="offset points",
                        va="center", fontsize=9)  # fmt: skip
        else:
            ax.annotate(f"{total:.0f}", (pos, total), xytext=(0, 3), textcoords="offset points",
                        ha="center", fontsize=9)  # fmt: skip
    top = float(totals.max()) * 1.12 if totals.size else 1.0
    (ax.set_xlim if horizontal else ax.set_ylim)(0, top)


def _hbars(ax: Axes, labels: list[str], values: list[int], colors: list[str]) -> None:
    y = np.arange(len(labels))
    bars = ax.barh(y, values, color=colors)
    ax.bar_label(bars, padding=3, fontsize=9)
    ax.set_yticks(y, labels)
    ax.invert_yaxis()  # largest first, at the top
    ax.grid(axis="y", visible=False)
    _integer_axis(ax, "x")
    ax.margins(x=0.12)


def outcomes(by_reason: pl.DataFrame, path: Path) -> Path | None:
    """Horizontal bars: episodes per (outcome, reason), coloured by outcome."""
    if by_reason.is_empty():
        return None
    rows = by_reason.head(15).to_dicts()
    labels = [_shorten(f"{r['outcome']}: {r['reason']}") for r in rows]
    colors = [_color(OUTCOME_COLORS, r["outcome"]) for r in rows]
    with _figure(path, 10, 1.2 + 0.42 * len(rows)) as fig:
        ax = fig.add_subplot()
        _hbars(ax, labels, [r["count"] for r in rows], colors)
        ax.set_title("Episodes by outcome and reason")
        ax.set_xlabel("episodes")
    return path


def nodes(per_node: pl.DataFrame, path: Path) -> Path | None:
    """Stacked bars: episodes per node, by outcome."""
    if per_node.is_empty():
        return None
    wide = per_node.pivot("outcome", index="node", values="count").fill_null(0).sort("node")
    names = wide["node"].to_list()
    outcomes_ = _ordered([c for c in wide.columns if c != "node"], OUTCOME_ORDER)
    with _figure(path, max(6.0, 1.2 * len(names) + 3), 4.8) as fig:
        ax = fig.add_subplot()
        bottom = np.zeros(len(names))
        for outcome in outcomes_:
            counts = wide[outcome].to_numpy().astype(float)
            ax.bar(names, counts, bottom=bottom, label=outcome, width=0.6,
                   color=_color(OUTCOME_COLORS, outcome))  # fmt: skip
            bottom += counts
        _totals(ax, names, bottom, horizontal=False)
        ax.set_title("Episodes per node")
        ax.set_xlabel("node")
        ax.set_ylabel("episodes")
        ax.grid(axis="x", visible=False)
        _integer_axis(ax)
        ax.legend(title="outcome", loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return path


def alerts(by_rule: pl.DataFrame, path: Path) -> Path | None:
    """Horizontal stacked bars: alerts per rule, split by Falco priority."""
    if by_rule.is_empty():
        return None
    wide = by_rule.pivot("priority", index="rule", values="count").fill_null(0)
    priorities = _ordered([c for c in wide.columns if c != "rule"], list(PRIORITY_COLORS))
    wide = wide.with_columns(pl.sum_horizontal(priorities).alias("_total"))
    wide = wide.sort(["_total", "rule"], descending=[True, False]).head(15)
    rules = [_shorten(r) for r in wide["rule"].to_list()]
    with _figure(path, 10, 1.4 + 0.45 * len(rules)) as fig:
        ax = fig.add_subplot()
        left = np.zeros(len(rules))
        for priority in priorities:
            counts = wide[priority].to_numpy().astype(float)
            ax.barh(rules, counts, left=left, label=priority,
                    color=_color(PRIORITY_COLORS, priority))  # fmt: skip
            left += counts
        _totals(ax, rules, left, horizontal=True)
        ax.invert_yaxis()
        ax.grid(axis="y", visible=False)
        _integer_axis(ax, "x")
        ax.set_title("Alerts by rule and priority")
        ax.set_xlabel("alerts")
        ax.legend(title="priority", loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return path


def offenders(images: pl.DataFrame, commands: pl.DataFrame, path: Path) -> Path | None:
    """Two panels: images and commands that set off the most alerts."""
    if images.is_empty() and commands.is_empty():
        return None
    rows = max(images.height, commands.height)
    with _figure(path, 12, 1.6 + 0.42 * rows) as fig:
        left, right = fig.subplots(1, 2)
        for ax, df, column, title in (
            (left, images, "image", "Images with the most alerts"),
            (right, commands, "proc_cmdline", "Commands with the most alerts"),
        ):
            labels = [_shorten(str(v), 40) for v in df[column].to_list()]
            _hbars(ax, labels, df["alerts"].to_list(), ["#c62828"] * df.height)
            ax.set_title(title)
            ax.set_xlabel("alerts")
    return path
