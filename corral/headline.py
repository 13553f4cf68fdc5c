"""Headline figures for `corral status`, scraped from each process's /metrics."""

from __future__ import annotations

import contextlib

from contract.config import StackConfig
from observability.metrics import scrape

_FIGURES = {
    "corral_sandboxes": "sandboxes",
    "corral_episodes_total": "episodes finished",
    "corral_alerts_total": "alerts",
    "corral_oom_kills_total": "OOM kills",
    "corral_provision_duration_seconds_count": "provisions",
    "corral_exec_duration_seconds_count": "execs",
}


def headline_figures(config: StackConfig) -> dict[str, float]:
    """Sum the headline metrics over every node worker that answers."""
    totals: dict[str, float] = {}
    for node in config.node_names():
        port, _ = config.metrics_ports(node)
        with contextlib.suppress(Exception):  # a node that does not answer adds nothing
            samples = scrape(f"http://127.0.0.1:{port}/metrics", timeout=1.0)
            for metric, label in _FIGURES.items():
                if metric in samples:
                    totals[label] = totals.get(label, 0.0) + samples[metric]
    return totals
