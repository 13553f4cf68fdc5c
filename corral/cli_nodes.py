"""`corral node up|down|list|drain|forget|kill`: the fleet's nodes.

`up`, `down` and `kill` act on this machine (a node is containerd, a node
worker and a sensor here); `list`, `drain` and `forget` ask the node registry
in Temporal, so they work from any machine that reaches it.
"""

from __future__ import annotations

from datetime import UTC, datetime

import click
from rich.table import Table

from corral.cli_common import Context, console, emit_json, out, pass_ctx, run_async


@click.group()
def node() -> None:
    """Nodes: join this machine, stop or kill its node, list and drain the fleet."""


@node.command("up")
@click.option("--name", "name", required=True, help="The node's name, e.g. node-4 or gpu-a.")
@click.option("--temporal", default=None, metavar="HOST:PORT", help="The control plane's Temporal.")
@click.option("--intake", "intake_url", default=None, metavar="URL", help="The alert intake.")
@pass_ctx
@run_async
async def node_up(ctx: Context, name: str, temporal: str | None, intake_url: str | None) -> None:
    """Start a node here (containerd, node worker, sensor); undrains it."""
    from corral.ops.nodes import join_node

    status = await join_node(
        ctx.config,
        name,
        temporal=temporal,
        intake_url=intake_url,
        progress=lambda msg: console.print(f"[dim]starting {msg}…[/]"),
    )
    click.echo(f"{name} is up: it polls {ctx.config.node_task_queue(name)}")
    if not status.up:
        console.print("[yellow]some part of this machine's stack is not healthy: corral status[/]")


@node.command("down")
@click.argument("name")
@click.option("--now", is_flag=True, help="Stop at once; its running episodes fail (node lost).")
@click.option("--timeout", "timeout_s", type=float, default=3600.0, show_default=True,
              help="Seconds to wait for running episodes before stopping anyway.")  # fmt: skip
@pass_ctx
@run_async
async def node_down(ctx: Context, name: str, now: bool, timeout_s: float) -> None:
    """Drain this machine's node NAME, wait for its episodes, then stop it and
    remove its sandboxes. `--now` stops it at once."""
    from corral.ops.nodes import stop_node

    stopped = await stop_node(
        ctx.config,
        name,
        now=now,
        timeout_s=timeout_s,
        say=lambda msg: console.print(f"[dim]{msg}[/]"),
        warn=lambda msg: console.print(f"[yellow]{msg}[/]"),
    )
    click.echo("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))


@node.command("kill")
@click.argument("name")
@pass_ctx
@run_async
async def node_kill(ctx: Context, name: str) -> None:
    """SIGKILL every process of node NAME at once, as a crash would (drills, tests)."""
    from corral.ops.nodes import kill_node

    pids = await kill_node(ctx.config, name)
    click.echo(f"killed {name}: {len(pids)} processes" if pids else f"{name} was not running")


@node.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_ctx
@run_async
async def node_list(ctx: Context, as_json: bool) -> None:
    """Every node the registry knows, with its state (ready, draining, lost)."""
    from corral.ops.nodes import list_nodes, node_headroom

    nodes = await list_nodes(ctx.config)
    if as_json:
        emit_json([info.model_dump(mode="json") for info in nodes])
        return
    table = Table(title=f"Nodes ({len(nodes)})", title_justify="left")
    for col in ("node", "state", "sandboxes", "busy", "headroom", "load1", "host", "last seen"):
        table.add_column(col)
    now = datetime.now(UTC)
    for info in nodes:
        beat = info.heartbeat
        ago = (now - info.last_seen).total_seconds()
        table.add_row(
            info.name, _state(info.state), str(beat.use.sandboxes), str(beat.use.busy),
            node_headroom(info), f"{beat.load1:.2f}", beat.host,
            "present" if info.present else f"{ago:.0f} s ago",
        )  # fmt: skip
    out.print(table)


def _state(state: str) -> str:
    colour = {"ready": "green", "draining": "yellow", "lost": "red"}.get(state, "white")
    return f"[{colour}]{state}[/]"


@node.command("drain")
@click.argument("name")
@pass_ctx
@run_async
async def node_drain(ctx: Context, name: str) -> None:
    """No new episodes on NAME; running ones finish. `corral node up` undrains."""
    from corral.ops.nodes import drain_node

    await drain_node(ctx.config, name, by="corral node drain")
    click.echo(f"{name} is draining: no new episodes; running ones finish")


@node.command("forget")
@click.argument("name")
@pass_ctx
@run_async
async def node_forget(ctx: Context, name: str) -> None:
    """Remove NAME from the registry now (a lost node leaves by itself after 10 min)."""
    from corral.ops.nodes import forget_node

    await forget_node(ctx.config, name, by="corral node forget")
    click.echo(f"{name} forgotten: it is listed again only if it heartbeats again")


COMMANDS = [node]
