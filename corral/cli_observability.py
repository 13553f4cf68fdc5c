"""`corral prometheus-config`: where Prometheus finds every process of the stack."""

from __future__ import annotations

from pathlib import Path

import click

from corral.cli_common import Context, fail, out, pass_ctx
from observability.metrics import BIND_HOST
from observability.prometheus import ScrapeTarget, prometheus_yaml
from workers.config import StackConfig


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


@click.command("prometheus-config")
@click.option(
    "--out",
    "out_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="File to write (standard output when omitted).",
)
@click.option("--interval", type=click.FloatRange(min=0.1), default=15.0, show_default=True)
@pass_ctx
def prometheus_config(ctx: Context, out_path: Path | None, interval: float) -> None:
    """A Prometheus scrape config for every process of this stack (its ports)."""
    text = prometheus_yaml(stack_targets(ctx.config), interval_s=interval)
    if out_path is None:
        click.echo(text, nl=False)
        return
    if not out_path.parent.is_dir():
        fail(f"--out {out_path}: directory {out_path.parent} does not exist")
    out_path.write_text(text)
    out.print(f"wrote {out_path}: run prometheus --config.file={out_path}")


COMMANDS = [prometheus_config]
