"""`corral export`: trajectories of closed episodes for training pipelines."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from corral.cli_common import Context, emit_json, fail, out, pass_ctx, run_async
from corral.cli_tools import parse_since
from corral.export import FORMATS, ExportFormat, export_trajectories, write_rows
from corral.sdk import Corral


@click.command()
@click.option("--since", default=None, help="Episodes closed since: 30m, 2h, 1d or an ISO time.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="jsonl", show_default=True)
@click.option(
    "--out",
    "out_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="File to write (jsonl: standard output when omitted).",
)
@click.option("--limit", type=click.IntRange(1), default=100_000, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print a summary as JSON.")
@pass_ctx
@run_async
async def export(
    ctx: Context,
    since: str | None,
    fmt: ExportFormat,
    out_path: Path | None,
    limit: int,
    as_json: bool,
) -> None:
    """Write trajectories (per step: action, observation, exit code, timings, alerts;
    per episode: reward, outcome) as JSON lines or Parquet."""
    if out_path is None and (fmt == "parquet" or as_json):
        fail(f"{'--json' if as_json else '--format parquet'} needs --out FILE")
    if out_path is not None and not out_path.parent.is_dir():
        fail(f"--out {out_path}: directory {out_path.parent} does not exist")
    corral = await Corral.connect(ctx.config)
    rows = await export_trajectories(corral, parse_since(since), limit=limit)
    write_rows(rows, fmt, out_path if out_path is not None else sys.stdout)
    summary = {
        "episodes": len(rows),
        "steps": sum(len(row.steps) for row in rows),
        "format": fmt,
        "out": str(out_path) if out_path else "-",
    }
    if as_json:
        emit_json(summary)
    elif out_path is not None:
        out.print(
            f"exported {summary['episodes']} episodes, {summary['steps']} steps to {out_path}"
        )


COMMANDS = [export]
