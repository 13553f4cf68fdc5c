"""`corral sim`: the real control plane against hundreds of simulated nodes."""

from __future__ import annotations

import click
from pydantic import ValidationError
from rich.table import Table

from corral.cli_common import Context, console, emit_json, fail, out, pass_ctx, run_async

# What `--json` must always carry (the contract); the report has more.
JSON_KEYS = (
    "placement_p50_ms",
    "placement_p99_ms",
    "episodes_per_s",
    "temporal_cpu_ms_per_episode",
    "max_signals_per_s_per_workflow",
    "hottest_history_events",
    "lost",
    "stuck",
)


@click.command("sim")
@click.option("--nodes", type=int, default=100, show_default=True, help="Simulated nodes.")
@click.option("--sandboxes-per-node", type=int, default=8, show_default=True)
@click.option("--rate", type=float, default=5.0, show_default=True, help="Episode starts a second.")
@click.option("--duration", "duration_s", type=float, default=30.0, show_default=True,
              help="Seconds of arrivals.")  # fmt: skip
@click.option("--steps", type=int, default=5, show_default=True, help="Steps per episode.")
@click.option("--kill-fraction", type=float, default=0.0, show_default=True,
              help="Share of nodes killed at once halfway through.")  # fmt: skip
@click.option("--partition-fraction", type=float, default=0.0, show_default=True,
              help="Share of nodes whose heartbeats are cut for 40 s halfway through.")  # fmt: skip
@click.option("--slow-fraction", type=float, default=0.0, show_default=True,
              help="Share of nodes 10 x slower from halfway through.")  # fmt: skip
@click.option("--grace", "grace_s", type=float, default=150.0, show_default=True,
              help="Seconds after the last arrival for every episode to close.")  # fmt: skip
@click.option("--port-base", type=int, default=None,
              help="First of the sim stack's ports (default 25233).")  # fmt: skip
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_ctx
@run_async
async def sim(ctx: Context, as_json: bool, port_base: int | None, **values: object) -> None:
    """Run the real control plane (its own Temporal, workflow worker, janitor) against
    simulated nodes, and report placement latency, server cost and lost episodes."""
    from corral.sim import DEFAULT_PORT_BASE, SimOptions, run_sim

    try:
        options = SimOptions.model_validate({**values, "port_base": port_base or DEFAULT_PORT_BASE})
    except ValidationError as err:
        first = err.errors()[0]
        fail(f"--{str(first['loc'][0]).replace('_', '-')}: {first['msg']}")
        return
    report = await run_sim(
        options, ctx.config.root, say=lambda msg: console.print(f"[dim]{msg}…[/]")
    )
    if as_json:
        emit_json(report)
        return
    table = Table(title=f"corral sim: {report.nodes} nodes", title_justify="left")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in report.model_dump().items():
        table.add_row(key, str(value))
    out.print(table)


COMMANDS = [sim]
