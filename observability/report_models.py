"""The figures of a report, as data: what `corral report --json` prints.

Apart from `report.py` (the analysis) so that `plots.py`, which report.py
imports, can name them without importing report.py back.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

__all__ = ["OutcomeReason", "PhaseLatency", "ReportSummary"]


class PhaseLatency(BaseModel):
    phase: str
    count: int
    p50: float | None
    p90: float | None
    p99: float | None


class OutcomeReason(BaseModel):
    outcome: str
    reason: str
    count: int


class ReportSummary(BaseModel):
    """The figures of a report, for `corral report --json` and tests."""

    records_dir: str
    out_dir: str
    generated_at: datetime
    since: datetime | None
    message: str | None = None  # set when there was nothing to report
    window_start: datetime | None = None
    window_end: datetime | None = None
    episodes_total: int = 0
    episodes_by_outcome: dict[str, int] = {}
    outcomes_by_reason: list[OutcomeReason] = []
    episodes_by_node: dict[str, int] = {}
    completed_per_minute: float | None = None  # mean over minutes with any episode ending
    steps_total: int = 0
    alerts_total: int = 0
    alerts_by_rule: dict[str, int] = {}
    alerts_by_priority: dict[str, int] = {}
    alerts_by_image: dict[str, int] = {}
    alerts_by_command: dict[str, int] = {}
    latency: list[PhaseLatency] = []
    plots: list[str] = []
    html: str | None = None
