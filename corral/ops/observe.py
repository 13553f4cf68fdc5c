"""Observing the stack: the report on what ran (`corral report`), the Prometheus
scrape config for every process (`corral prometheus-config`), a batch's results
as a Parquet table, and the CLI's own traces flushed before it exits.

The report and Parquet need the optional extras (`corral[report]`,
`corral[export]`); without them these functions raise `MissingExtra`, whose
message is one line naming the extra to install.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from contract.config import StackConfig
from contract.models import EpisodeResult
from observability.extras import MissingExtra, require
from observability.metrics import BIND_HOST
from observability.prometheus import ScrapeTarget, prometheus_yaml
from observability.report_models import ReportSummary

__all__ = [
    "MissingExtra",
    "build_report",
    "flush_traces",
    "prometheus_config",
    "stack_targets",
    "write_batch_results",
]


def stack_targets(config: StackConfig) -> list[ScrapeTarget]:
    """Every /metrics page of the stack: Temporal, workers (Corral's and the
    Temporal SDK's), intake, and each node's worker and sensor."""

    def at(port: int) -> str:
        return f"{BIND_HOST}:{port}"

    otel, sdk = config.metrics_ports()
    targets = [
        ScrapeTarget("temporal-server", at(config.temporal.dev_server.metrics_port)),
        ScrapeTarget("corral-workflow-worker", at(otel)),
        ScrapeTarget("temporal-sdk", at(sdk), {"process": "workflow-worker"}),
        ScrapeTarget("corral-intake", at(config.service_metrics_port())),
    ]
    for node in config.node_names():
        otel, sdk = config.metrics_ports(node)
        # Corral's own series carry `node` already; only the SDK's need it added.
        targets += [
            ScrapeTarget("corral-node-worker", at(otel)),
            ScrapeTarget("temporal-sdk", at(sdk), {"node": node, "process": "node-worker"}),
            ScrapeTarget("corral-sensor", at(config.service_metrics_port(node))),
        ]
    return targets


def prometheus_config(config: StackConfig, *, interval_s: float = 15.0) -> str:
    """A Prometheus scrape config (YAML) for every process of this stack, at its ports."""
    return prometheus_yaml(stack_targets(config), interval_s=interval_s)


def build_report(
    config: StackConfig,
    *,
    out_dir: Path | None = None,
    since: datetime | None = None,
) -> ReportSummary:
    """Analyse the stack's records (polars): plots and an HTML page written to
    `out_dir` (default `<state>/report`), only what ran since `since` if given.
    Needs `corral[report]`: `MissingExtra` otherwise."""
    for module in ("polars", "matplotlib"):
        require(module, "report", "corral report")
    from observability.report import build_report as _build

    return _build(config.records_dir, out_dir or config.state / "report", since)


def write_batch_results(results: Sequence[EpisodeResult], path: Path) -> None:
    """A batch's results as a Parquet table at `path`, one row per episode (outcome,
    reason, node, timings, reward's exit code, alerts, the whole result as JSON).
    Needs `corral[export]`: `MissingExtra` otherwise."""
    pl = require("polars", "export", "run-batch --out (Parquet)")

    rows = [
        {
            "episode_id": r.episode_id,
            "outcome": r.outcome,
            "reason": r.reason,
            "node": r.node,
            "image": r.image,
            "tenant": r.tenant,
            "steps": len(r.steps),
            "duration_s": r.duration_s,
            "provision_s": r.provision_s,
            "teardown_s": r.teardown_s,
            "reward_exit_code": r.reward.exit_code if r.reward else None,
            "alerts": [a.rule for a in r.alerts],
            "result_json": r.model_dump_json(),
        }
        for r in results
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    pl.DataFrame(rows).write_parquet(path)


def flush_traces(timeout_s: float = 30.0) -> bool:
    """Export the spans this process recorded (its Temporal calls), waiting
    `timeout_s` at most; False when they did not all go out in time."""
    from observability.tracing import flush_tracing

    return flush_tracing(timeout_millis=int(timeout_s * 1000))
