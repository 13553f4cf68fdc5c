"""`corral report` and `corral bench`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import click
from pydantic import BaseModel
from rich.progress import Progress

from corral.cli_common import Context, console, emit_json, fail, out, pass_ctx, run_async

T = TypeVar("T")


def parse_since(value: str | None) -> datetime | None:
    """`30m`, `2h`, `1d` ago, or an ISO time."""
    if not value:
        return None
    units = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
    if value[-1] in units and value[:-1].isdigit():
        return datetime.now(UTC) - timedelta(**{units[value[-1]]: int(value[:-1])})
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        fail(f"--since {value!r}: use e.g. 30m, 2h, 1d or an ISO time")
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


@click.command()
@click.option("--since", default=None, help="Only what ran since: 30m, 2h, 1d or an ISO time.")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where to write the plots and index.html (default <state>/report).",
)
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
def report(ctx: Context, since: str | None, out_dir: Path | None, as_json: bool) -> None:
    """Analyse what ran (polars): plots and an HTML page."""
    from corral.ops.observe import build_report

    summary = build_report(ctx.config, out_dir=out_dir, since=parse_since(since))
    if as_json:
        emit_json(summary)
        return
    if summary.message:
        out.print(summary.message)
    out.print(
        f"episodes: {summary.episodes_total} {dict(summary.episodes_by_outcome)}; "
        f"alerts: {summary.alerts_total}"
    )
    out.print(f"report: {summary.html}")


@click.command()
@click.option("--n", "n", type=click.IntRange(1, 10_000), default=30, show_default=True)
@click.option("--concurrency", type=click.IntRange(1, 256), default=4, show_default=True)
@click.option("--exec-n", type=click.IntRange(1, 10_000), default=50, show_default=True)
@click.option(
    "--density",
    type=click.IntRange(1, 5000),
    default=None,
    help="Instead: hold this many idle sandboxes on one node and measure them.",
)
@click.option(
    "--shim-group",
    type=click.IntRange(1, 100),
    default=20,
    show_default=True,
    help="With --density: sandboxes per shim.",
)
@click.option(
    "--peers",
    is_flag=True,
    help="Also time ctr, podman and docker (where installed) and report CPU per episode.",
)
@click.option(
    "--steps",
    is_flag=True,
    help="Instead: tool calls per second, N sandboxes x M calls, beside docker exec and ctr.",
)
@click.option("--steps-sandboxes", type=click.IntRange(1, 256), default=8, show_default=True)
@click.option("--steps-calls", type=click.IntRange(1, 10_000), default=20, show_default=True)
@click.option(
    "--elastic",
    is_flag=True,
    help="Instead: busy sandboxes' throughput alone and beside idle ones (elastic CPU).",
)
@click.option("--idle", type=click.IntRange(0, 10_000), default=1000, show_default=True)
@click.option("--busy", type=click.IntRange(1, 200), default=20, show_default=True)
@click.option(
    "--idle-spinning",
    type=click.IntRange(0, 10_000),
    default=0,
    show_default=True,
    help="With --elastic: idle sandboxes that keep a CPU-bound process running.",
)
@click.option(
    "--fork",
    is_flag=True,
    help="Instead: snapshot, fork into 8 and into 32, hibernate -> restore, through the stack.",
)
@click.option("--fork-rounds", type=click.IntRange(1, 100), default=5, show_default=True)
@click.option(
    "--defense",
    is_flag=True,
    help="Instead: create+start and density with user namespace/quota off vs on (--n, --idle).",
)
@click.option("--fork-mb", type=click.IntRange(1, 4096), default=100, show_default=True)
@click.option(
    "--sensor",
    is_flag=True,
    help="Instead: exec- and open-heavy steps with the sensor off and on (its CPU cost).",
)
@click.option("--sensor-n", type=click.IntRange(1, 100_000), default=1000, show_default=True)
@click.option(
    "--drill",
    is_flag=True,
    help="With --sensor: every misbehaviour on every episode path; caught, false alarms, "
    "alert -> frozen.",
)
@click.option(
    "--watermark",
    is_flag=True,
    help="With --sensor: what waiting for the sensor's verdict costs a one-step episode (--n).",
)
@click.option(
    "--burst",
    is_flag=True,
    help="Instead: a training step's burst of interactive episodes opened at once, "
    "beside docker run/exec/rm.",
)
@click.option("--burst-width", type=click.IntRange(1, 10_000), default=128, show_default=True)
@click.option("--burst-calls", type=click.IntRange(1, 1000), default=5, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
@run_async
async def bench(
    ctx: Context,
    n: int,
    concurrency: int,
    exec_n: int,
    density: int | None,
    shim_group: int,
    peers: bool,
    steps: bool,
    steps_sandboxes: int,
    steps_calls: int,
    elastic: bool,
    idle: int,
    busy: int,
    idle_spinning: int,
    fork: bool,
    fork_rounds: int,
    fork_mb: int,
    defense: bool,
    sensor: bool,
    sensor_n: int,
    drill: bool,
    watermark: bool,
    burst: bool,
    burst_width: int,
    burst_calls: int,
    as_json: bool,
) -> None:
    """Measure Corral and the raw containerd baseline side by side; print ratios."""
    from corral.bench.core import describe, run_bench, run_density

    await _require_stack(ctx)
    if density is not None:
        held = await _with_progress(
            "idle sandboxes",
            density,
            lambda tick: run_density(ctx.config, n=density, group=shim_group, tick=tick),
        )
        _show(held, as_json)
        return

    if steps:
        await _bench_steps(ctx, steps_sandboxes, steps_calls, as_json)
        return

    if peers:
        await _bench_peers(ctx, n, concurrency, exec_n, as_json)
        return

    if burst:
        await _bench_burst(ctx, burst_width, burst_calls, as_json)
        return

    if elastic:
        await _bench_elastic(ctx, idle, busy, idle_spinning, as_json)
        return

    if fork:
        await _bench_fork(ctx, fork_rounds, fork_mb, as_json)
        return

    if defense:
        await _bench_defense(ctx, n, idle, as_json)
        return

    if drill and not sensor:
        fail("--drill is a mode of --sensor: corral bench --sensor --drill")
    if sensor and drill:
        await _bench_drill(ctx, as_json)
        return
    if watermark and not sensor:
        fail("--watermark is a mode of --sensor: corral bench --sensor --watermark")
    if sensor and watermark:
        await _bench_watermark(ctx, n, concurrency, as_json)
        return

    if sensor:
        await _bench_sensor(ctx, sensor_n, as_json)
        return

    result = await _with_progress(
        "bench",
        2 * n + 3 * exec_n,
        lambda tick: run_bench(ctx.config, n=n, concurrency=concurrency, exec_n=exec_n, tick=tick),
    )
    _show(result, as_json, describe)


def _with_progress(
    title: str, total: int, run: Callable[[Callable[[], None]], Awaitable[T]]
) -> Awaitable[T]:
    """Run a bench with a progress bar that `run`'s tick advances."""

    async def go() -> T:
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task(title, total=total)
            return await run(lambda: progress.advance(task))

    return go()


def _show(
    report: BaseModel, as_json: bool, lines: Callable[[Any], list[str]] | None = None
) -> None:
    """JSON, the bench's own description, or one line per field."""
    if as_json:
        emit_json(report)
        return
    if lines is None:
        for key, value in report.model_dump().items():
            out.print(f"{key:24s} {value}", markup=False)
        return
    for line in lines(report):
        out.print(line, markup=False)


async def _bench_burst(ctx: Context, width: int, calls: int, as_json: bool) -> None:
    from corral.bench.burst import describe, run_burst

    report = await _with_progress(
        "bench --burst",
        2 * width,
        lambda tick: run_burst(ctx.config, width=width, calls=calls, tick=tick),
    )
    _show(report, as_json, describe)


async def _bench_sensor(ctx: Context, n: int, as_json: bool) -> None:
    from corral.bench.sensor import describe, run_sensor

    rounds = 3
    report = await _with_progress(
        "bench --sensor",
        4 * rounds,
        lambda tick: run_sensor(ctx.config, n=n, rounds=rounds, tick=tick),
    )
    _show(report, as_json, describe)


async def _bench_watermark(ctx: Context, n: int, concurrency: int, as_json: bool) -> None:
    from corral.bench.watermark import describe, run_watermark

    report = await _with_progress(
        "bench --sensor --watermark",
        n,
        lambda tick: run_watermark(ctx.config, n=n, concurrency=concurrency, tick=tick),
    )
    _show(report, as_json, describe)


async def _bench_drill(ctx: Context, as_json: bool) -> None:
    from corral.bench.drill import describe, drill_total, run_drill

    def say(message: str) -> None:
        console.print(message, markup=False)  # stderr: --json's stdout stays clean

    report = await _with_progress(
        "bench --sensor --drill",
        drill_total(),
        lambda tick: run_drill(ctx.config, tick=tick, say=say),
    )
    _show(report, as_json, describe)


async def _bench_peers(ctx: Context, n: int, concurrency: int, exec_n: int, as_json: bool) -> None:
    from corral.bench.peers import describe_peers, run_peers

    report = await _with_progress(
        "bench --peers",
        8 * n + 6 * exec_n,
        lambda tick: run_peers(ctx.config, n=n, concurrency=concurrency, exec_n=exec_n, tick=tick),
    )
    _show(report, as_json, describe_peers)


async def _bench_elastic(ctx: Context, idle: int, busy: int, spinning: int, as_json: bool) -> None:
    from corral.bench.elastic import run_elastic

    report = await _with_progress(
        "idle sandboxes",
        idle,
        lambda tick: run_elastic(ctx.config, idle=idle, busy=busy, spinning=spinning, tick=tick),
    )
    _show(report, as_json)


async def _bench_defense(ctx: Context, n: int, density: int, as_json: bool) -> None:
    from corral.bench.defense import DENSITY_ORDER, VARIANTS, run_defense

    report = await _with_progress(
        "bench --defense",
        n * len(VARIANTS) + len(DENSITY_ORDER) * density,
        lambda tick: run_defense(ctx.config, n=n, density=density, tick=tick),
    )
    _show(report, as_json)


async def _require_stack(ctx: Context) -> None:
    """Every mode measures the running stack: say so in one line when it is not up."""
    from corral.ops.stack import unhealthy_components

    down = await unhealthy_components(ctx.config)
    if down:
        fail(
            f"the stack under {ctx.config.state} is not up ({', '.join(down)}): "
            "start it with `corral up`, then bench"
        )


async def _bench_fork(ctx: Context, rounds: int, data_mb: int, as_json: bool) -> None:
    from corral.bench.fork import run_fork

    report = await _with_progress(
        "fork rounds",
        rounds,
        lambda tick: run_fork(ctx.config, rounds=rounds, data_mb=data_mb, tick=tick),
    )
    _show(report, as_json)


async def _bench_steps(ctx: Context, sandboxes: int, calls: int, as_json: bool) -> None:
    from corral.bench.steps import describe, run_steps

    report = await _with_progress(
        "bench --steps",
        5 * sandboxes * calls,
        lambda tick: run_steps(ctx.config, sandboxes=sandboxes, calls=calls, tick=tick),
    )
    _show(report, as_json, describe)


COMMANDS = [report, bench]
