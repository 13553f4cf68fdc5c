"""`corral episode ...` and `corral run`: episodes for trainers and on-call."""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import os
import shutil
import statistics
import sys
import termios
import time
import tty
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from contract.models import EpisodeResult
from corral.cli_common import (
    Context,
    console,
    emit_json,
    fail,
    load_spec_file,
    out,
    pass_ctx,
    run_async,
    shell_join,
)
from corral.errors import EpisodeError
from corral.ops.observe import write_batch_results
from corral.sdk import Corral, Job, parse_spec


@click.group()
def episode() -> None:
    """Start, drive, inspect, kill and release episodes."""


def _spec_from_options(
    spec_file: Path | None,
    image: str | None,
    steps: tuple[str, ...],
    reward: str | None,
    interactive: bool,
) -> dict[str, Any]:
    spec: dict[str, Any] = load_spec_file(spec_file) if spec_file else {}
    if image:
        spec["image"] = image
    if steps:
        spec["steps"] = [*spec.get("steps", []), *steps]
    if reward:
        spec["reward"] = reward
    if interactive:
        spec["interactive"] = True
    if "image" not in spec:
        raise click.UsageError("give --image or a --spec file with an image")
    return spec


@episode.command("start")
@click.option("--spec", "spec_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--image", default=None)
@click.option("--step", "steps", multiple=True, help="A shell command; repeat for more steps.")
@click.option("--reward", default=None, help="Reward command (its last output line is the reward).")
@click.option("--interactive", is_flag=True, help="Wait for exec/finish requests after the steps.")
@click.option("--id", "episode_id", default=None)
@click.option("--node", default=None)
@click.option("--wait", is_flag=True, help="Wait for the result.")
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
@run_async
async def episode_start(
    ctx: Context,
    spec_file: Path | None,
    image: str | None,
    steps: tuple[str, ...],
    reward: str | None,
    interactive: bool,
    episode_id: str | None,
    node: str | None,
    wait: bool,
    as_json: bool,
) -> None:
    """Start an episode; with --wait, print its result."""
    # Validate before connecting: a bad spec is reported as such, stack or not.
    spec = parse_spec(_spec_from_options(spec_file, image, steps, reward, interactive))
    corral = await Corral.connect(ctx.config)
    handle = await corral.start_episode(spec, episode_id=episode_id, node=node)
    if not wait:
        emit_json({"episode_id": handle.id}) if as_json else click.echo(handle.id)
        return
    try:
        result = await handle.result()
    except EpisodeError as err:
        _print_result(err.result, as_json)
        raise click.ClickException(f"episode {handle.id} {_outcome(err)}: {err}") from err
    _print_result(result, as_json)


def _outcome(err: EpisodeError) -> str:
    return err.result.outcome if err.result else type(err).__name__


def _print_result(result: EpisodeResult | None, as_json: bool) -> None:
    if result is None:
        return
    if as_json:
        emit_json(result)
        return
    out.print(
        f"[bold]{result.episode_id}[/] {result.outcome} on {result.node} "
        f"in {result.duration_s:.2f} s {result.reason}"
    )
    # The reward is the step log's last entry already; older results lack it there.
    extra = [result.reward] if result.reward and result.reward not in result.steps else []
    for step in result.steps + extra:
        mark = "[green]ok[/]" if step.ok else f"[red]exit {step.exit_code}[/]"
        out.print(f"  [{step.index}] {mark} {step.duration_s * 1000:.0f} ms  $ {step.cmd}")
        for stream in (step.stdout, step.stderr):
            for line in stream.rstrip("\n").splitlines()[:20]:
                out.print(f"      {line}", markup=False)


@episode.command("exec", context_settings={"ignore_unknown_options": True})
@click.argument("episode_id")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option("--timeout-s", type=float, default=None)
@click.option(
    "--follow", is_flag=True, help="Print stdout as it comes (a background job; needs the agent)."
)
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
@run_async
async def episode_exec(
    ctx: Context,
    episode_id: str,
    command: tuple[str, ...],
    timeout_s: float | None,
    follow: bool,
    as_json: bool,
) -> None:
    """Run COMMAND in a running interactive episode (a Temporal Update)."""
    corral = await Corral.connect(ctx.config)
    if follow:
        if as_json:
            fail("--follow prints output as it comes; it has no --json")
        await _exec_followed(corral, episode_id, shell_join(command), timeout_s)
        return
    result = await corral.episode(episode_id).exec(shell_join(command), timeout_s=timeout_s)
    if as_json:
        emit_json(result)
        return
    click.echo(result.stdout, nl=False)
    click.echo(result.stderr, nl=False, err=True)
    raise SystemExit(result.exit_code)


async def _exec_followed(
    corral: Corral, episode_id: str, command: str | list[str], timeout_s: float | None
) -> None:
    """stdout as it comes, then stderr; exits with the command's status (128+N if killed)."""
    job = await corral.episode(episode_id).spawn(command, timeout_s=timeout_s)
    async for chunk in job.follow():
        sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()
    state = await job.wait()
    sys.stderr.buffer.write(await job.output("stderr"))
    raise SystemExit(state.exit_code if not state.signal else 128 + state.signal)


@episode.command("shell")
@click.argument("episode_id")
@click.option("--cmd", "command", default="/bin/sh", show_default=True, help="What the PTY runs.")
@pass_ctx
@run_async
async def episode_shell(ctx: Context, episode_id: str, command: str) -> None:
    """A shell on a pseudo-terminal in a running interactive episode (needs the agent).

    Keys go in by `job_stdin` Updates, output comes back by `job_output` polls:
    usable, not snappy (each round trip crosses Temporal)."""
    corral = await Corral.connect(ctx.config)
    size = shutil.get_terminal_size()
    job = await corral.episode(episode_id).spawn(command, pty=(size.lines, size.columns))
    with _raw_terminal(sys.stdin.fileno()):
        await _shell_session(job)
    state = await job.wait()
    raise SystemExit(state.exit_code if not state.signal else 128 + state.signal)


@contextlib.contextmanager
def _raw_terminal(fd: int) -> Iterator[None]:
    """Keys pass through as typed (Ctrl-C included) while the remote terminal echoes them."""
    if not os.isatty(fd):
        yield
        return
    saved = termios.tcgetattr(fd)
    tty.setraw(fd)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


async def _shell_session(job: Job) -> None:
    """Output to our stdout until the remote side ends; our stdin to the job meanwhile."""
    typing = asyncio.create_task(_forward_keys(job, sys.stdin.fileno()))
    try:
        async for chunk in job.follow():
            sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
    finally:
        typing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await typing


async def _forward_keys(job: Job, fd: int) -> None:
    """What is typed, in order; keys typed during a round trip go in the next one."""
    loop = asyncio.get_running_loop()
    pending: asyncio.Queue[bytes] = asyncio.Queue()
    loop.add_reader(fd, lambda: pending.put_nowait(os.read(fd, 4096)))
    try:
        while True:
            data = await pending.get()
            while not pending.empty():
                data += pending.get_nowait()
            if not data:  # our stdin ended (a pipe): nothing more will come
                loop.remove_reader(fd)
                return
            await job.send(data)
    finally:
        with contextlib.suppress(ValueError, OSError):
            loop.remove_reader(fd)


@episode.command("show")
@click.argument("episode_id")
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
@run_async
async def episode_show(ctx: Context, episode_id: str, as_json: bool) -> None:
    """Status of one episode (live query while it runs, else its result)."""
    corral = await Corral.connect(ctx.config)
    handle = corral.episode(episode_id)
    if await corral.is_running(episode_id):
        status = await handle.status()
        emit_json(status) if as_json else out.print(status.model_dump())
        return
    try:
        _print_result(await handle.result(), as_json)
    except EpisodeError as err:
        _print_result(err.result, as_json)
        if err.result is None:
            click.echo(f"{episode_id}: {type(err).__name__}: {err}")


@episode.command("snapshot")
@click.argument("episode_id")
@click.option("--name", default=None, help="The snapshot's tag (default: s<N>).")
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
@run_async
async def episode_snapshot(ctx: Context, episode_id: str, name: str | None, as_json: bool) -> None:
    """Commit a running episode's filesystem as an image; prints the ref to start from."""
    corral = await Corral.connect(ctx.config)
    snap = await corral.episode(episode_id).snapshot(name)
    if as_json:
        emit_json(snap)
        return
    click.echo(snap.ref)


@episode.command("list")
@click.option("--state", default=None, help="EpisodeState, e.g. running, quarantined.")
@click.option("--query", default=None, help="A Temporal List Filter.")
@click.option("--parent", default=None, help="Only the episodes forked from this one.")
@click.option("--limit", type=int, default=50)
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
@run_async
async def episode_list(
    ctx: Context,
    state: str | None,
    query: str | None,
    parent: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List episodes (newest first) from Temporal's visibility store."""
    clauses = [f"EpisodeState = '{state}'"] if state else []
    clauses += [query] if query else []
    corral = await Corral.connect(ctx.config)
    rows = await corral.list_episodes(" AND ".join(clauses) or None, limit=limit, parent=parent)
    if as_json:
        emit_json([r.__dict__ for r in rows])
        return
    table = Table("episode", "status", "state", "node", "image", "alerts", "started")
    for r in rows:
        table.add_row(
            r.episode_id,
            r.status,
            r.state,
            r.node,
            r.image,
            ",".join(r.anomaly_rules),
            f"{r.start_time:%H:%M:%S}" if r.start_time else "",
        )
    out.print(table)


def _on_call_command(action: str, help_text: str) -> None:
    """`corral episode kill|release ID [--reason ...]`: the on-call signals."""

    @episode.command(action, help=help_text)
    @click.argument("episode_id")
    @click.option("--reason", default="")
    @pass_ctx
    @run_async
    async def command(ctx: Context, episode_id: str, reason: str) -> None:
        corral = await Corral.connect(ctx.config)
        handle = corral.episode(episode_id)
        await getattr(handle, action)(reason=reason, by=f"cli:{getpass.getuser()}")
        click.echo(f"{action} sent to {episode_id}")


_on_call_command("kill", "Kill an episode now (its sandbox is torn down).")
_on_call_command("release", "Release a quarantined episode (thaw it and let it go on).")


@click.command("run")
@click.option(
    "--spec",
    "spec_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    required=True,
)
@click.option("--episodes", type=click.IntRange(1, 100_000), default=10)
@click.option("--concurrency", type=click.IntRange(1, 10_000), default=8)
@click.option(
    "--out",
    "out_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("results.parquet"),
    show_default=True,
)
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
@run_async
async def run_batch(
    ctx: Context, spec_file: Path, episodes: int, concurrency: int, out_file: Path, as_json: bool
) -> None:
    """Run a batch of episodes with a progress bar; write every result to Parquet."""
    # Validate before connecting or drawing a progress bar: one line on a bad spec.
    spec = parse_spec(load_spec_file(spec_file))
    corral = await Corral.connect(ctx.config)
    results: list[EpisodeResult] = []
    started = time.monotonic()
    columns = (
        TextColumn("[bold]episodes"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[tally]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=as_json) as progress:
        task = progress.add_task("run", total=episodes, tally="")
        async for result in corral.run_batch(spec, n=episodes, concurrency=concurrency):
            results.append(result)
            tally = Counter(r.outcome for r in results)
            progress.update(task, advance=1, tally=" ".join(f"{k}={v}" for k, v in tally.items()))
    summary = batch_summary(results, time.monotonic() - started)
    write_batch_results(results, out_file)
    summary["results_file"] = str(out_file)
    if as_json:
        emit_json(summary)
        return
    out.print(
        f"[bold]{summary['episodes']} episodes[/] in {summary['wall_s']:.1f} s "
        f"({summary['per_second']:.2f}/s): {summary['outcomes']}"
    )
    for reason, count in summary["failed_by_reason"].items():
        out.print(f"  failed x{count}: {reason}")
    out.print(
        f"  duration p50 {summary['p50_s']:.2f} s, p99 {summary['p99_s']:.2f} s; "
        f"results in {out_file}"
    )


def batch_summary(results: list[EpisodeResult], wall_s: float) -> dict[str, Any]:
    durations = sorted(r.duration_s for r in results) or [0.0]
    failed = Counter(r.reason for r in results if r.outcome == "failed")
    return {
        "episodes": len(results),
        "wall_s": wall_s,
        "per_second": len(results) / wall_s if wall_s else 0.0,
        "outcomes": dict(Counter(r.outcome for r in results)),
        "failed_by_reason": dict(failed.most_common()),
        "p50_s": statistics.median(durations),
        "p99_s": durations[min(len(durations) - 1, int(0.99 * len(durations)))],
    }


@click.group()
def spec() -> None:
    """Episode specs: convert other formats."""


@spec.command("from-compose")
@click.argument("compose_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--agent", default=None, help="The compose service the agent runs in.")
def spec_from_compose_file(compose_file: Path, agent: str | None) -> None:
    """Print an episode spec (YAML) with the compose file's services beside the agent."""
    import yaml

    from corral.compose import ComposeError, spec_from_compose

    try:
        converted, dropped = spec_from_compose(yaml.safe_load(compose_file.read_text()), agent)
    except (ComposeError, yaml.YAMLError) as err:
        raise click.ClickException(f"{compose_file}: {' '.join(str(err).split())}") from err
    if dropped:
        click.echo(f"corral: not carried over: {', '.join(dropped)}", err=True)
    click.echo(yaml.safe_dump(converted, sort_keys=False), nl=False)


COMMANDS = [episode, run_batch, spec]
