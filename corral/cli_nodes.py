"""`corral node up|down|list|drain|kill`: the fleet's nodes.

`up`, `down` and `kill` act on this machine (a node is containerd, a node
worker and a sensor here); `list` and `drain` ask the node registry in
Temporal, so they work from any machine that reaches it.
"""

from __future__ import annotations

from datetime import UTC, datetime

import click
from rich.table import Table

from corral.cli import Context, console, emit_json, fail, out, pass_ctx, run_async


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
    from workers.stack import Stack

    status = await Stack(ctx.config).node_up(
        name,
        progress=lambda msg: console.print(f"[dim]starting {msg}…[/]"),
        temporal=temporal,
        intake_url=intake_url,
    )
    click.echo(f"{name} is up: it polls {ctx.config.node_task_queue(name)}")
    if not status.up:
        console.print("[yellow]some part of this machine's stack is not healthy: corral status[/]")


@node.command("down")
@click.argument("name")
@pass_ctx
@run_async
async def node_down(ctx: Context, name: str) -> None:
    """Stop this machine's node NAME and remove its sandboxes."""
    from workers.stack import Stack

    stopped = await Stack(ctx.config).node_down(name)
    click.echo("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))


@node.command("kill")
@click.argument("name")
@pass_ctx
@run_async
async def node_kill(ctx: Context, name: str) -> None:
    """SIGKILL every process of node NAME at once, as a crash would (drills, tests)."""
    from workers.stack import Stack

    pids = await Stack(ctx.config).node_kill(name)
    click.echo(f"killed {name}: {len(pids)} processes" if pids else f"{name} was not running")


@node.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_ctx
@run_async
async def node_list(ctx: Context, as_json: bool) -> None:
    """Every node the registry knows, with its state (ready, draining, lost)."""
    from activities.capacity import headroom
    from workers.temporal import connect
    from workflows.nodes import list_nodes

    nodes = await list_nodes(await connect(ctx.config))
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
            headroom(beat.capacity, beat.use), f"{beat.load1:.2f}", beat.host, f"{ago:.0f} s ago",
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
    from workers.temporal import connect
    from workflows.nodes import drain_node, list_nodes

    client = await connect(ctx.config)
    known = {info.name for info in await list_nodes(client)}
    if name not in known:
        fail(f"unknown node {name!r}: the registry knows {', '.join(sorted(known)) or 'no nodes'}")
    await drain_node(client, name, by="corral node drain")
    click.echo(f"{name} is draining: no new episodes; running ones finish")


COMMANDS = [node]
