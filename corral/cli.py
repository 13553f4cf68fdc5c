"""`corral`: the command line.

Every command that prints data takes `--json`; every failure a user can cause
ends with one line, `corral: error: ...`, and a non-zero exit status.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click
from rich.table import Table

# Sub-command modules import their shared helpers from corral.cli_common.
from corral.cli_common import Context, console, emit_json, out, pass_ctx, run_async
from corral.ops.observe import MissingExtra, flush_traces


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    envvar="CORRAL_CONFIG",
    help="Stack configuration (default: temporal-dev.yaml).",
)
@click.pass_context
def cli(ctx: click.Context, config_path: Path | None) -> None:
    """Corral: AI-agent episodes in containerd sandboxes, as durable Temporal workflows."""
    ctx.obj = Context(config_path)


# ----------------------------------------------------------------- the stack
@cli.command()
@click.option("--nodes", type=click.IntRange(1, 16), default=None, help="Sandbox nodes to run.")
@click.option(
    "--role",
    type=click.Choice(["all", "control"]),
    default="all",
    help="all: everything here; control: Temporal, workflow worker, intake, janitor "
    "(nodes join with `corral node up`).",
)
@click.option(
    "--isolated", is_flag=True, help="Each node in its own network namespace (a fleet on one host)."
)
@click.option(
    "--allow-unwatched",
    is_flag=True,
    help="Let agent commands run on a node whose sensor is down (by default they wait).",
)
@pass_ctx
@run_async
async def up(
    ctx: Context, nodes: int | None, role: str, isolated: bool, allow_unwatched: bool
) -> None:
    """Start the dev stack in the background (harmless when it is up)."""
    from corral.ops.stack import stack_up

    status = await stack_up(
        ctx.config,
        nodes=nodes,
        role="control" if role == "control" else "all",
        isolated=isolated,
        allow_unwatched=allow_unwatched,
        progress=lambda msg: console.print(f"[dim]starting {msg}…[/]"),
    )
    _print_status(status)
    click.echo(f"Web UI: {status.ui_url}")


@cli.command()
@pass_ctx
@run_async
async def down(ctx: Context) -> None:
    """Stop every process the stack started and remove its sandboxes."""
    from corral.ops.stack import stack_down

    stopped = await stack_down(
        ctx.config, progress=lambda msg: console.print(f"[dim]stopping {msg}…[/]")
    )
    click.echo("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_ctx
@run_async
async def status(ctx: Context, as_json: bool) -> None:
    """Say what runs and whether each part is healthy."""
    from corral.ops.stack import stack_status

    result = await stack_status(ctx.config)
    if as_json:
        emit_json(result)
    else:
        _print_status(result)
    if not result.up:
        sys.exit(1)


def _print_status(status: Any) -> None:
    table = Table(
        title=f"Corral stack ({'up' if status.up else 'NOT healthy'})", title_justify="left"
    )
    for col in ("component", "state", "pid", "detail"):
        table.add_column(col)
    for c in status.components:
        state = (
            "[green]healthy[/]"
            if c.healthy
            else ("[yellow]unhealthy[/]" if c.running else "[red]down[/]")
        )
        table.add_row(c.name, state, str(c.pid or ""), c.detail)
    out.print(table)
    for name, value in (status.headline or {}).items():
        out.print(f"  {name}: {value:g}")


# --------------------------------------------------------------------- demo
@cli.command()
@click.option("--episodes", type=click.IntRange(1, 1000), default=5)
@pass_ctx
@run_async
async def demo(ctx: Context, episodes: int) -> None:
    """Bring the stack up if needed, run a few episodes, print their results."""
    from corral.demo import run_demo

    await run_demo(ctx.config, episodes=episodes, say=console.print, out=out)


# from corral.cli_* modules: images, sandboxes, episodes, policies, reports, bench
def _register() -> None:
    from corral import (
        cli_episodes,
        cli_export,
        cli_images,
        cli_nodes,
        cli_observability,
        cli_policy,
        cli_sim,
        cli_tenants,
        cli_tools,
    )

    modules = (cli_images, cli_episodes, cli_policy, cli_tools, cli_nodes, cli_tenants)
    for module in (*modules, cli_export, cli_observability, cli_sim):
        for command in module.COMMANDS:
            cli.add_command(command)


def main() -> None:
    _register()
    try:
        cli(prog_name="corral")
        code: int | str | None = 0
    except SystemExit as done:
        code = done.code
    except MissingExtra as err:  # an optional dependency (reports, Parquet) is absent
        click.echo(f"Error: {err}", err=True)
        code = 1
    flush_traces()
    # Leave without interpreter finalization: the Temporal SDK's native threads
    # can abort a short-lived client at exit (temporalio/sdk-python#300).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else (0 if code is None else 1))
