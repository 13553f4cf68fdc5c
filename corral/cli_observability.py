"""`corral prometheus-config`: where Prometheus finds every process of the stack."""

from __future__ import annotations

from pathlib import Path

import click

from corral.cli_common import Context, fail, out, pass_ctx
from corral.ops.observe import prometheus_config as scrape_config


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
    text = scrape_config(ctx.config, interval_s=interval)
    if out_path is None:
        click.echo(text, nl=False)
        return
    if not out_path.parent.is_dir():
        fail(f"--out {out_path}: directory {out_path.parent} does not exist")
    out_path.write_text(text)
    out.print(f"wrote {out_path}: run prometheus --config.file={out_path}")


COMMANDS = [prometheus_config]
