"""`corral image ...` and `corral sandbox run`: the sandbox layer for people."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError
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
from sandbox import Containerd, SandboxSpec, build_busybox_image, resolve_image_name
from sandbox.errors import CorralError
from sandbox.labels import PARENT_EPISODE_LABEL
from sandbox.registry import Credentials, Progress, credentials_from
from sandbox.transfer import push_image
from workers.config import StackConfig, describe_validation_error


@contextlib.asynccontextmanager
async def node_client(config: StackConfig, node: str) -> AsyncIterator[Containerd]:
    if node not in config.node_names():
        fail(f"node {node!r} is not one of {', '.join(config.node_names())}")
    socket = config.containerd_socket(node)
    if not socket.exists():
        fail(f"containerd of {node} is not running ({socket} missing); run `corral up`")
    async with await Containerd.connect(
        str(socket), namespace=config.nodes.containerd_namespace
    ) as c:
        yield c


def _nodes(config: StackConfig, node: str | None) -> list[str]:
    return [node] if node else config.node_names()


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
    config = ctx.config
    if kind == "busybox":
        for each in _nodes(config, node):
            async with node_client(config, each) as client:
                info = await build_busybox_image(client, resolve_image_name(name or "busybox"))
            click.echo(f"{each}: {info.name} {info.digest[:19]}")
        return
    await _build_debian(config, [p for p in packages.split(",") if p.strip()], name, node)


async def _build_debian(
    config: StackConfig, packages: list[str], name: str | None, node: str | None
) -> None:
    from sandbox.debian import build_debian_image, write_debian_archive

    # Outside the stack's state: a debootstrap cache outlives `corral down`.
    cache = Path(os.environ.get("CORRAL_CACHE_DIR") or config.root / ".cache")
    image_name = resolve_image_name(
        name or ("debian-" + "-".join(sorted(packages)) if packages else "debian")
    )
    started = time.monotonic()
    click.echo(f"building {image_name} (debootstrap, cached in {cache})…", err=True)
    built = await asyncio.to_thread(build_debian_image, cache / "debian", packages)
    with tempfile.TemporaryDirectory(prefix="corral-image-") as tmp:
        archive = await asyncio.to_thread(
            write_debian_archive, built, Path(tmp) / "image.tar", image_name
        )
        for each in _nodes(config, node):
            async with node_client(config, each) as client:
                await client.images.import_archive(archive)
    click.echo(f"{image_name}: {len(built.layers)} layers in {time.monotonic() - started:.1f} s")


@image.command("import")
@click.argument("archive", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--node", default=None)
@pass_ctx
@run_async
async def image_import(ctx: Context, archive: Path, node: str | None) -> None:
    """Import an OCI image archive (tar)."""
    for each in _nodes(ctx.config, node):
        async with node_client(ctx.config, each) as client:
            for info in await client.images.import_archive(archive):
                click.echo(f"{each}: {info.name} {info.digest[:19]}")


@image.command("ls")
@click.option("--node", default=None)
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
@run_async
async def image_ls(ctx: Context, node: str | None, as_json: bool) -> None:
    """List images."""
    rows = []
    for each in _nodes(ctx.config, node):
        async with node_client(ctx.config, each) as client:
            rows += [{"node": each, **i.model_dump()} for i in await client.images.list()]
    if as_json:
        emit_json(rows)
        return
    table = Table("node", "name", "digest", "size", "parent episode")
    for r in rows:
        parent = r["labels"].get(PARENT_EPISODE_LABEL, "")  # snapshots name their episode
        table.add_row(r["node"], r["name"], r["digest"][:19], f"{r['size'] / 1e6:.1f} MB", parent)
    out.print(table)


@image.command("rm")
@click.argument("name")
@click.option("--node", default=None)
@pass_ctx
@run_async
async def image_rm(ctx: Context, name: str, node: str | None) -> None:
    """Remove an image."""
    for each in _nodes(ctx.config, node):
        async with node_client(ctx.config, each) as client:
            await client.images.remove(resolve_image_name(name))
        click.echo(f"{each}: removed {resolve_image_name(name)}")


def _credentials(username: str | None, password_stdin: bool) -> Credentials | None:
    """``--username U --password-stdin`` (the password never goes on the command line)."""
    if password_stdin and not username:
        fail("--password-stdin needs --username")
    if not username:
        return None
    password = sys.stdin.read().rstrip("\n") if password_stdin else ""
    return credentials_from(username, password)


@contextlib.contextmanager
def _layer_progress(label: str) -> Iterator[Progress]:
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
    options = ctx.config.registry.options()
    credentials = _credentials(username, password_stdin)
    for each in _nodes(ctx.config, node):
        async with node_client(ctx.config, each) as client:
            with _layer_progress(each) as progress:
                info = await client.pulls.pull(ref, options, credentials, progress)
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
    options = ctx.config.registry.options()
    credentials = _credentials(username, password_stdin)
    source = node or ctx.config.node_names()[0]
    async with node_client(ctx.config, source) as client:
        with _layer_progress("push") as progress:
            digest = await push_image(
                client.images, local_ref, remote_ref, options, credentials, progress
            )
    click.echo(f"{source}: {resolve_image_name(local_ref)} -> {remote_ref} {digest[:19]}")


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
    rows = []
    for each in _nodes(ctx.config, node):
        async with node_client(ctx.config, each) as client:
            removed = await client.images.prune(keep_bytes=int(keep_gb * 1e9))
        rows += [{"node": each, "name": info.name, "digest": info.digest} for info in removed]
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
    try:
        spec = SandboxSpec.model_validate(
            {
                "image": resolve_image_name(image_name),
                "memory_mb": memory_mb,
                "cpu_cores": cpus,
                "pids_limit": pids,
                "runtime": runtime,
                "read_only_root": read_only_root,
                "workspace_mb": workspace_mb,
                "network": network_mode,
                "tmpfs_mb": max(1, min(64, memory_mb // 4)),  # /tmp + /dev/shm below the limit
                "egress": _parse_egress(egress),
                "labels": {"corral.cli": "sandbox-run"},
                # the default /workspace is in the image; a read-only root has no writable cwd
                **({"workdir": "/tmp"} if read_only_root and workspace_mb is None else {}),
            }
        )
    except ValidationError as err:
        fail(f"invalid sandbox: {describe_validation_error(err)}")
    sandbox_id = f"cli-{uuid.uuid4().hex[:12]}"
    async with node_client(ctx.config, node or ctx.config.node_names()[0]) as client:
        try:
            try:
                box = await client.create_sandbox(sandbox_id, spec, spec.labels)
                result = await box.exec(shell_join(command), timeout_s=timeout_s)
            except CorralError as err:
                fail(f"sandbox: {err}")
        finally:
            with contextlib.suppress(CorralError):
                await client.destroy_sandbox(sandbox_id)
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
