"""`corral node up|down|list|drain|forget|kill`: the fleet's nodes.

`up`, `down` and `kill` act on this machine (a node is containerd, a node
worker and a sensor here); `list`, `drain` and `forget` ask the node registry
in Temporal, so they work from any machine that reaches it.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

import click
from rich.table import Table
from temporalio.client import Client

from corral.cli_common import Context, console, emit_json, fail, out, pass_ctx, run_async


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


# After the drain signal, placements the workflow workers made from their
# cached registry (refreshed every second) may still land: wait that out.
DRAIN_SETTLE_S = 3.0
DRAIN_POLL_S = 2.0


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
    from workers.stack import Stack

    stack = Stack(ctx.config)
    stack.check_local_node(name)
    if not now:
        await _drain_and_wait(ctx, name, timeout_s)
    stopped = await stack.node_down(name)
    click.echo("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))


async def _drain_and_wait(ctx: Context, name: str, timeout_s: float) -> None:
    from temporalio.service import RPCError, RPCStatusCode

    from workers.temporal import connect
    from workflows.nodes import drain_node, episodes_on

    client = await connect(ctx.config)
    try:
        await drain_node(client, name, by="corral node down")
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            raise
        return  # its registry shard never started: the node never joined, nothing runs there
    await asyncio.sleep(DRAIN_SETTLE_S)
    deadline = time.monotonic() + timeout_s
    while (running := await episodes_on(client, name)) and time.monotonic() < deadline:
        console.print(f"[dim]{name} is draining: {running} episodes still running…[/]")
        await asyncio.sleep(DRAIN_POLL_S)
    if running:
        console.print(f"[yellow]{running} episodes still on {name} after {timeout_s:.0f} s[/]")


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
    from workflows.nodes import drain_node

    client = await connect(ctx.config)
    await _known_node(client, name)
    await drain_node(client, name, by="corral node drain")
    click.echo(f"{name} is draining: no new episodes; running ones finish")


@node.command("forget")
@click.argument("name")
@pass_ctx
@run_async
async def node_forget(ctx: Context, name: str) -> None:
    """Remove NAME from the registry now (a lost node leaves by itself after 10 min)."""
    from workers.temporal import connect
    from workflows.nodes import forget_node

    client = await connect(ctx.config)
    await _known_node(client, name)
    await forget_node(client, name, by="corral node forget")
    click.echo(f"{name} forgotten: it is listed again only if it heartbeats again")


COMMANDS = [node]


async def _known_node(client: Client, name: str) -> None:
    """Fail in one line unless the registry knows NAME."""
    from workflows.nodes import list_nodes

    known = {info.name for info in await list_nodes(client)}
    if name not in known:
        fail(f"unknown node {name!r}: the registry knows {', '.join(sorted(known)) or 'no nodes'}")
