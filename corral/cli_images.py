"""`corral image ...` and `corral sandbox run`: the sandbox layer for people."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
from rich.progress import BarColumn, DownloadColumn, TaskID, TextColumn, TransferSpeedColumn
from rich.progress import Progress as RichProgress
from rich.table import Table

from corral.cli_common import (
    Context,
    console,
    emit_json,
    fail,
    out,
    pass_ctx,
    run_async,
    shell_join,
)
from corral.ops import images as ops
from corral.ops.images import LayerReport
from corral.ops.sandboxes import run_in_sandbox, sandbox_spec


@click.group()
def image() -> None:
    """Build, import, pull, push, list, prune and remove images (every node unless --node)."""


@image.command("build")
@click.argument("kind", type=click.Choice(["busybox", "debian"]))
@click.option("--packages", default="", help="debian: comma-separated packages, e.g. python3,git")
@click.option("--name", default=None, help="Image name (default corral.local/<kind>:latest).")
@click.option("--node", default=None)
@pass_ctx
@run_async
async def image_build(
    ctx: Context, kind: str, packages: str, name: str | None, node: str | None
) -> None:
    """Build an image locally (no registry needed) and import it."""
    if kind == "busybox":
        async for each, info in ops.build_busybox(ctx.config, name=name, node=node):
            click.echo(f"{each}: {info.name} {info.digest[:19]}")
        return
    built = await ops.build_debian(
        ctx.config,
        [p for p in packages.split(",") if p.strip()],
        name=name,
        node=node,
        say=lambda msg: click.echo(msg, err=True),
    )
    click.echo(f"{built.name}: {built.layers} layers in {built.seconds:.1f} s")


@image.command("import")
@click.argument("archive", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--node", default=None)
@pass_ctx
@run_async
async def image_import(ctx: Context, archive: Path, node: str | None) -> None:
    """Import an OCI image archive (tar)."""
    async for each, info in ops.import_archive(ctx.config, archive, node=node):
        click.echo(f"{each}: {info.name} {info.digest[:19]}")


@image.command("ls")
@click.option("--node", default=None)
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
@run_async
async def image_ls(ctx: Context, node: str | None, as_json: bool) -> None:
    """List images (a snapshot's with the episode it was committed from)."""
    images = await ops.list_images(ctx.config, node=node)
    if as_json:
        emit_json([each.to_dict() for each in images])
        return
    table = Table("node", "name", "digest", "size", "parent episode")
    for each in images:
        info = each.info
        table.add_row(
            each.node, info.name, info.digest[:19], f"{info.size / 1e6:.1f} MB",
            each.parent_episode,
        )  # fmt: skip
    out.print(table)


@image.command("rm")
@click.argument("name")
@click.option("--node", default=None)
@pass_ctx
@run_async
async def image_rm(ctx: Context, name: str, node: str | None) -> None:
    """Remove an image."""
    async for each, full in ops.remove_image(ctx.config, name, node=node):
        click.echo(f"{each}: removed {full}")


def _password(username: str | None, password_stdin: bool) -> str | None:
    """``--username U --password-stdin`` (the password never goes on the command line)."""
    if password_stdin and not username:
        fail("--password-stdin needs --username")
    if not username:
        return None
    return sys.stdin.read().rstrip("\n") if password_stdin else ""


@contextlib.contextmanager
def _layer_progress(label: str) -> Iterator[LayerReport]:
    """A rich progress bar per layer; the callback the registry transfer reports to."""
    bars = RichProgress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=console,
        transient=False,
        disable=not console.is_terminal,
    )
    tasks: dict[str, TaskID] = {}

    def report(digest: str, done: int, total: int) -> None:
        if digest not in tasks:
            tasks[digest] = bars.add_task(f"{label} {digest[7:19]}", total=total)
        bars.update(tasks[digest], completed=done)

    with bars:
        yield report


def _with_auth(func: Any) -> Any:
    """``--username`` and ``--password-stdin``, shared by pull and push."""
    func = click.option(
        "--password-stdin", is_flag=True, help="Read the password from standard input."
    )(func)
    return click.option(
        "--username", default=None, help="Registry user (else $CORRAL_REGISTRY_USERNAME)."
    )(func)


@image.command("pull")
@click.argument("ref")
@click.option("--node", default=None)
@_with_auth
@pass_ctx
@run_async
async def image_pull(
    ctx: Context, ref: str, node: str | None, username: str | None, password_stdin: bool
) -> None:
    """Pull REF (host[:port]/repo[:tag|@digest]) from its registry and unpack it."""
    password = _password(username, password_stdin)
    pulls = ops.pull_image(
        ctx.config, ref, node=node, username=username, password=password,
        progress=_layer_progress,
    )  # fmt: skip
    async for each, info in pulls:
        click.echo(f"{each}: {info.name} {info.digest[:19]}")


@image.command("push")
@click.argument("local_ref")
@click.argument("remote_ref")
@click.option("--node", default=None, help="Node whose image to push (default: the first).")
@_with_auth
@pass_ctx
@run_async
async def image_push(
    ctx: Context,
    local_ref: str,
    remote_ref: str,
    node: str | None,
    username: str | None,
    password_stdin: bool,
) -> None:
    """Push LOCAL_REF (an image a node has) to a registry as REMOTE_REF."""
    password = _password(username, password_stdin)
    pushed = await ops.push_image(
        ctx.config, local_ref, remote_ref, node=node, username=username, password=password,
        progress=_layer_progress,
    )  # fmt: skip
    click.echo(f"{pushed.node}: {pushed.local} -> {pushed.remote} {pushed.digest[:19]}")


@image.command("prune")
@click.option(
    "--keep-gb",
    type=float,
    default=0.0,
    show_default=True,
    help="Stop once the images left take at most this much.",
)
@click.option("--node", default=None)
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
@run_async
async def image_prune(ctx: Context, keep_gb: float, node: str | None, as_json: bool) -> None:
    """Remove least-recently-used registry images no sandbox uses (local images stay)."""
    if keep_gb < 0:
        fail(f"--keep-gb must be zero or more, got {keep_gb:g}")
    removed = await ops.prune_images(ctx.config, keep_bytes=int(keep_gb * 1e9), node=node)
    rows = [{"node": i.node, "name": i.info.name, "digest": i.info.digest} for i in removed]
    if as_json:
        emit_json(rows)
        return
    for row in rows:
        click.echo(f"{row['node']}: removed {row['name']}")
    if not rows:
        click.echo("nothing to prune")


@click.group()
def sandbox() -> None:
    """Sandboxes straight on containerd, without Temporal."""


def _parse_egress(values: tuple[str, ...]) -> list[dict[str, object]]:
    """``CIDR:PORT`` (``*`` = every port), optionally ``/udp``: ``198.19.255.1/32:7001/udp``."""
    rules: list[dict[str, object]] = []
    for value in values:
        body, protocol = value, "tcp"
        for suffix in ("/tcp", "/udp"):
            if value.endswith(suffix):
                body, protocol = value[: -len(suffix)], suffix[1:]
        cidr, sep, port = body.rpartition(":")
        if not sep or not cidr or not (port == "*" or port.isdigit()):
            fail(f"--egress {value!r}: want CIDR:PORT[/udp], e.g. 198.19.255.1/32:7001")
        rules.append(
            {
                "cidr": cidr if "/" in cidr else f"{cidr}/32",
                "port": None if port == "*" else int(port),
                "protocol": protocol,
            }
        )
    return rules


@sandbox.command("run", context_settings={"ignore_unknown_options": True})
@click.option("--image", "image_name", default="busybox", show_default=True)
@click.option("--memory-mb", type=int, default=512, show_default=True)
@click.option("--cpus", type=float, default=1.0, show_default=True)
@click.option("--pids", type=int, default=256, show_default=True)
@click.option("--timeout-s", type=float, default=60.0, show_default=True)
@click.option("--runtime", default="runc", show_default=True)
@click.option("--read-only-root", is_flag=True)
@click.option(
    "--workspace-mb",
    type=int,
    default=None,
    help="Size-capped ext4 volume at /workspace (the only disk quota).",
)
@click.option(
    "--network",
    "network_mode",
    type=click.Choice(["none", "allowlist"]),
    default="none",
    show_default=True,
)
@click.option(
    "--egress",
    multiple=True,
    metavar="CIDR:PORT[/udp]",
    help="Allowed destination (repeatable; needs --network allowlist; port * = any).",
)
@click.option("--node", default=None)
@click.option("--json", "as_json", is_flag=True)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@pass_ctx
@run_async
async def sandbox_run(
    ctx: Context,
    image_name: str,
    memory_mb: int,
    cpus: float,
    pids: int,
    timeout_s: float,
    runtime: str,
    read_only_root: bool,
    workspace_mb: int | None,
    network_mode: str,
    egress: tuple[str, ...],
    node: str | None,
    as_json: bool,
    command: tuple[str, ...],
) -> None:
    """Create a sandbox, run COMMAND in it, print its output, tear it down.

    Exits with COMMAND's exit code (137 when it was killed at --timeout-s).
    """
    if timeout_s <= 0:
        fail(f"--timeout-s must be positive, got {timeout_s:g}")
    spec = sandbox_spec(
        image_name,
        memory_mb=memory_mb,
        cpus=cpus,
        pids=pids,
        runtime=runtime,
        read_only_root=read_only_root,
        workspace_mb=workspace_mb,
        network=network_mode,
        egress=_parse_egress(egress),
    )
    result = await run_in_sandbox(
        ctx.config, spec, shell_join(command), timeout_s=timeout_s, node=node
    )
    if as_json:
        emit_json(result)
    else:
        click.echo(result.stdout, nl=False)
        click.echo(result.stderr, nl=False, err=True)
        if result.truncated:
            click.echo("corral: output truncated", err=True)
        if result.timed_out:
            click.echo(f"corral: command timed out after {timeout_s:g} s", err=True)
    raise SystemExit(result.exit_code)


COMMANDS = [image, sandbox]
