"""`corral bench`: Corral against the raw baseline, side by side, in one run.

The baseline drives the same `sandbox/` client code straight at containerd
(create, start, one exec, teardown); Corral runs the same work as one-step
episodes through Temporal. Both run at the same concurrency on the same
stack, one after the other, so the ratio is what Temporal and the workflow
machinery cost. A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel

from activities.pool import WarmPool, pool_template
from contract.config import StackConfig
from contract.labels import BENCH_LABEL, OWNER_LABEL
from contract.models import EpisodeSpec, Resources, Step
from corral.bench.elastic import RatePoint, create_idle, destroy_all
from corral.sdk import Corral
from sandbox import BUSYBOX_IMAGE, Containerd, SandboxSpec


class EpisodeMeter(Protocol):
    """Brackets the episode series (CPU accounting in `corral.bench.peers`)."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


class Series(BaseModel):
    name: str
    count: int
    failures: int
    wall_s: float
    per_second: float
    p50_ms: float
    p90_ms: float
    p99_ms: float


class BenchReport(BaseModel):
    n: int
    concurrency: int
    series: list[Series]
    ratios: dict[str, float]
    targets: dict[str, str]


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


async def _measure(
    name: str,
    n: int,
    concurrency: int,
    one: Callable[[int], Awaitable[None]],
    tick: Callable[[], None],
    prepare: Callable[[], Awaitable[None]] | None = None,
) -> Series:
    limit = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    failures = 0

    async def timed(i: int) -> None:
        nonlocal failures
        async with limit:
            if prepare is not None:  # untimed set-up of each run
                await prepare()
            started = time.perf_counter()
            try:
                await one(i)
                latencies.append(time.perf_counter() - started)
            except Exception:
                failures += 1
            tick()

    started = time.perf_counter()
    await asyncio.gather(*(timed(i) for i in range(n)))
    wall = time.perf_counter() - started
    ms = sorted(x * 1000 for x in latencies)
    return Series(
        name=name,
        count=len(latencies),
        failures=failures,
        wall_s=wall,
        per_second=len(latencies) / wall if wall else 0.0,
        p50_ms=statistics.median(ms) if ms else 0.0,
        p90_ms=_percentile(ms, 0.90),
        p99_ms=_percentile(ms, 0.99),
    )


SPACED_SERIES = "episode through Temporal (spaced)"


async def run_bench(
    config: StackConfig,
    *,
    n: int,
    concurrency: int,
    exec_n: int,
    tick: Callable[[], None] = lambda: None,
    meter: EpisodeMeter | None = None,
    raw_meter: EpisodeMeter | None = None,
    cold: bool = False,
    sequential: bool = False,
    spaced_s: float = 0.0,
) -> BenchReport:
    """`cold`: episodes of a shape the warm pool does not serve (one MiB more
    memory), so every one creates its sandbox; `meter` and `raw_meter` bracket
    the episode and the raw lifecycle series; `sequential` adds a one-at-a-time
    episode series (latency without queueing, as peers are timed); `spaced_s`
    another one-at-a-time series with that pause before each episode, so each
    meets a quiet node (the deferred teardown and pool refill of the one before
    have run): the latency of one episode, not of a back-to-back stream."""
    node = config.node_names()[0]
    tag = uuid.uuid4().hex[:8]
    spec = SandboxSpec(image=BUSYBOX_IMAGE, labels={BENCH_LABEL: tag})
    async with await Containerd.connect(
        str(config.containerd_socket(node)), namespace=config.nodes.containerd_namespace
    ) as raw:

        async def raw_lifecycle(i: int) -> None:
            sandbox_id = f"bench-{tag}-{i}"
            try:
                box = await raw.create_sandbox(sandbox_id, spec, spec.labels)
                await box.exec(["echo", "hi"])
            finally:
                await raw.destroy_sandbox(sandbox_id)

        if raw_meter is not None:
            raw_meter.start()
        raw_series = await _measure("raw containerd lifecycle", n, concurrency, raw_lifecycle, tick)
        if raw_meter is not None:
            raw_meter.stop()
        raw_exec = await _raw_exec_series(raw, spec, tag, exec_n, tick)
        warm = await _warm_acquire_series(raw, tag, exec_n, tick)

    corral = await Corral.connect(config)
    episode = EpisodeSpec(
        image="busybox",
        steps=[Step(cmd="echo hi")],
        labels={"bench": tag},
        resources=Resources(memory_mb=Resources().memory_mb + 1) if cold else Resources(),
    )
    # Placement is part of the path; with more than one node, pin to the node
    # the raw series used so that both use one containerd.
    pinned = node if len(config.node_names()) > 1 else None

    async def one_episode(i: int) -> None:
        await corral.run_episode(episode, episode_id=f"bench-{tag}-{i}", node=pinned)

    if meter is not None:
        meter.start()
    episode_series = await _measure("episode through Temporal", n, concurrency, one_episode, tick)
    if meter is not None:
        meter.stop()
    if sequential:
        # Fresh episode ids: the concurrent series' sandboxes may still be going.
        series_one = await _measure(
            "episode through Temporal (sequential)", n, 1, lambda i: one_episode(n + i), tick
        )
    update_exec = await _update_exec_series(corral, node, tag, exec_n, tick)
    series = [raw_series, episode_series, raw_exec, update_exec, warm]
    if sequential:
        series.append(series_one)
    if spaced_s > 0:
        series.append(
            await _measure(
                SPACED_SERIES,
                n,
                1,
                lambda i: one_episode(2 * n + i),
                tick,
                prepare=lambda: asyncio.sleep(spaced_s),
            )
        )
    return BenchReport(
        n=n,
        concurrency=concurrency,
        series=series,
        ratios={
            "episode throughput / raw throughput": _ratio(
                episode_series.per_second, raw_series.per_second
            ),
            "episode p50 / raw lifecycle p50": _ratio(episode_series.p50_ms, raw_series.p50_ms),
            "update exec p50 / raw exec p50": _ratio(update_exec.p50_ms, raw_exec.p50_ms),
            "warm acquire p50 ms": round(warm.p50_ms, 2),
        },
        targets={
            "episode throughput / raw throughput": ">= 0.8",
            "update exec p50 / raw exec p50": "<= 2.0",
            "warm acquire p50 ms": "< 20",
        },
    )


async def _raw_exec_series(
    raw: Containerd, spec: SandboxSpec, tag: str, n: int, tick: Callable[[], None]
) -> Series:
    sandbox_id = f"bench-{tag}-exec"
    box = await raw.create_sandbox(sandbox_id, spec, spec.labels)
    try:

        async def one(_: int) -> None:
            await box.exec(["echo", "hi"])

        return await _measure("raw exec round trip", n, 1, one, tick)
    finally:
        await raw.destroy_sandbox(sandbox_id)


async def _warm_acquire_series(
    raw: Containerd, tag: str, n: int, tick: Callable[[], None]
) -> Series:
    """Claiming a pooled sandbox, until it is ready for its first exec.

    A pool of one, refilled before each claim, so each claim finds it warm;
    the refill itself is the cold path measured above."""
    pool = WarmPool(raw, f"bench-{tag}", {"busybox": 1})
    await pool.start()
    claimed: list[str] = []
    template = pool_template("busybox")

    async def refilled() -> None:
        while pool.ready_for("busybox") == 0:
            await asyncio.sleep(0.01)

    async def one(i: int) -> None:
        sandbox_id = await pool.acquire(template, {BENCH_LABEL: tag, OWNER_LABEL: f"{tag}-{i}"})
        if sandbox_id is None:
            raise RuntimeError("pool had no warm sandbox")
        claimed.append(sandbox_id)

    try:
        return await _measure("warm acquire (pool claim)", n, 1, one, tick, prepare=refilled)
    finally:
        await pool.stop(drain=True)
        for sandbox_id in claimed:
            await raw.destroy_sandbox(sandbox_id)


async def _update_exec_series(
    corral: Corral, node: str, tag: str, n: int, tick: Callable[[], None]
) -> Series:
    spec = EpisodeSpec(image="busybox", interactive=True, labels={"bench": tag})
    episode = await corral.start_episode(spec, episode_id=f"bench-{tag}-interactive", node=node)
    try:
        await episode.exec(["true"])  # wait for the sandbox; not measured

        async def one(_: int) -> None:
            await episode.exec(["echo", "hi"])

        return await _measure("exec round trip through a Temporal Update", n, 1, one, tick)
    finally:
        await episode.finish()


def _ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b else 0.0


def describe(report: BenchReport) -> list[str]:
    lines = [f"n={report.n}, concurrency={report.concurrency}"]
    for s in report.series:
        lines.append(
            f"{s.name:45s} {s.per_second:7.2f}/s  p50 {s.p50_ms:7.1f} ms  "
            f"p90 {s.p90_ms:7.1f} ms  p99 {s.p99_ms:7.1f} ms  failures {s.failures}"
        )
    for name, value in report.ratios.items():
        target = report.targets.get(name, "")
        lines.append(f"{name:45s} {value:7.3f}  {('target ' + target) if target else ''}")
    return lines


class DensityReport(BaseModel):
    requested: int
    created: int
    failures: int
    shim_group_size: int
    create_wall_s: float
    memory_used_mb: float
    memory_per_sandbox_mb: float
    threads_before: int
    threads_after: int
    threads_per_sandbox: float
    exec_ok_after: bool
    creation_rate: list[RatePoint]  # creations per second, per 250 in completion order


def _memory_used_mb() -> float:
    info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    kb = lambda key: int(info[key].split()[0])  # noqa: E731 - a local reader
    return (kb("MemTotal") - kb("MemAvailable")) / 1024


def _threads() -> int:
    return sum(1 for _ in Path("/proc").glob("[0-9]*/task/[0-9]*"))


async def run_density(
    config: StackConfig,
    *,
    n: int,
    group: int,
    concurrency: int = 4,
    tick: Callable[[], None] = lambda: None,
) -> DensityReport:
    """N idle sandboxes on one node: memory and threads each, then all removed."""
    node = config.node_names()[0]
    before_mem, before_threads = _memory_used_mb(), _threads()
    async with await Containerd.connect(
        str(config.containerd_socket(node)), namespace=config.nodes.containerd_namespace
    ) as raw:
        held = await create_idle(raw, n, group=group, concurrency=concurrency, tick=tick)
        created, failures, wall = held.ids, held.failures, held.wall_s
        try:
            await asyncio.sleep(2)  # let page cache and shims settle before reading
            used = _memory_used_mb() - before_mem
            threads = _threads()
            probe = await raw.get_sandbox(created[0]) if created else None
            exec_ok = bool(probe and (await probe.exec(["true"])).ok)
        finally:
            await destroy_all(raw, created)
    count = max(len(created), 1)
    return DensityReport(
        requested=n,
        created=len(created),
        failures=failures,
        shim_group_size=group,
        create_wall_s=wall,
        memory_used_mb=round(used, 1),
        memory_per_sandbox_mb=round(used / count, 2),
        threads_before=before_threads,
        threads_after=threads,
        threads_per_sandbox=round((threads - before_threads) / count, 1),
        exec_ok_after=exec_ok,
        creation_rate=held.rate,
    )
