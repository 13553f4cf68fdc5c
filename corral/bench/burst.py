"""`corral bench --burst`: a training step's batch of rollouts opened at once.

A GRPO step opens W rollouts together and waits for the last: the step takes
as long as the slowest one, so the start p99 is what a trainer pays. Each
rollout here is an interactive busybox episode that makes C tool calls
(`echo`), one at a time, then finishes. Beside it, in the same run, the same
work with `docker run -d` / `docker exec` / `docker rm -f` (docker brought by
corral/bench/engines.py). Both sides keep at most `in_flight` requests open
at once, as a trainer's client does. A benchmark, not a test: it asserts
nothing, and a rollout that fails is counted, not raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Protocol

from pydantic import BaseModel
from temporalio.service import RPCError

from contract.config import StackConfig
from contract.errors import CorralError
from contract.models import EpisodeSpec
from corral.bench.engines import Engine, EngineUnavailable, docker_engine
from corral.sdk import Corral, Episode

DEFAULT_IN_FLIGHT = 64
MAX_REASONS = 3


class BurstSide(BaseModel):
    """One side's figures: start = from opening the rollout to its first call's answer."""

    rollouts: int
    calls: int
    wall_s: float
    start_p50_ms: float
    start_p99_ms: float
    call_p50_ms: float
    call_p99_ms: float
    failures: int
    first_failure: str = ""


class BurstReport(BaseModel):
    width: int
    calls: int
    in_flight: int
    corral: BurstSide
    docker: BurstSide | None
    docker_skipped_because: str = ""
    max_waiting: int  # most Corral episodes seen waiting for a node at once
    waiting_reasons: list[str] = []  # why they waited, as episode.status() said it
    ratios: dict[str, float]
    targets: dict[str, str]


class Rollout(Protocol):
    """One rollout's lifecycle on one side: open, one call, close."""

    async def open(self, i: int) -> None: ...

    async def call(self, i: int, n: int) -> None: ...

    async def close(self, i: int) -> None: ...


class _Timings:
    def __init__(self) -> None:
        self.starts: list[float] = []
        self.calls: list[float] = []
        self.failures: list[str] = []


async def _timed(gate: asyncio.Semaphore, request: Awaitable[None]) -> float:
    """Seconds a request took, holding one of the client's in-flight slots."""
    async with gate:
        started = time.monotonic()
        await request
        return time.monotonic() - started


async def _one(side: Rollout, i: int, calls: int, gate: asyncio.Semaphore, t: _Timings) -> None:
    opened = time.monotonic()
    try:
        async with gate:
            await side.open(i)
        for n in range(calls):
            took = await _timed(gate, side.call(i, n))
            if n == 0:
                t.starts.append(time.monotonic() - opened)
            t.calls.append(took)
    except (CorralError, RuntimeError, OSError) as err:
        t.failures.append(f"rollout {i}: {' '.join(str(err).split())[:200]}")
    finally:
        try:
            async with gate:
                await side.close(i)
        except (CorralError, RuntimeError, OSError) as err:
            t.failures.append(f"rollout {i} close: {' '.join(str(err).split())[:200]}")


async def run_side(
    side: Rollout, width: int, calls: int, in_flight: int, tick: Callable[[], None]
) -> BurstSide:
    gate, timings = asyncio.Semaphore(in_flight), _Timings()

    async def rollout(i: int) -> None:
        await _one(side, i, calls, gate, timings)
        tick()

    started = time.monotonic()
    await asyncio.gather(*(rollout(i) for i in range(width)))
    wall = time.monotonic() - started
    return BurstSide(
        rollouts=width,
        calls=len(timings.calls),
        wall_s=round(wall, 2),
        start_p50_ms=_ms(timings.starts, 0.5),
        start_p99_ms=_ms(timings.starts, 0.99),
        call_p50_ms=_ms(timings.calls, 0.5),
        call_p99_ms=_ms(timings.calls, 0.99),
        failures=len(timings.failures),
        first_failure=timings.failures[0] if timings.failures else "",
    )


def _ms(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 1)


class CorralRollouts:
    """Interactive busybox episodes: start, exec C times, finish."""

    def __init__(self, corral: Corral, tag: str) -> None:
        self._corral = corral
        self._tag = tag
        self._episodes: dict[int, Episode] = {}
        self.spec = EpisodeSpec(image="busybox", interactive=True, labels={"bench": tag})

    async def open(self, i: int) -> None:
        episode_id = f"burst-{self._tag}-{i}"
        self._episodes[i] = await self._corral.start_episode(self.spec, episode_id=episode_id)

    async def call(self, i: int, n: int) -> None:
        result = await self._episodes[i].exec(f"echo call-{n}")
        if result.exit_code != 0 or result.stdout.strip() != f"call-{n}":
            raise RuntimeError(f"call {n} returned {result.exit_code}: {result.stdout[:80]!r}")

    async def close(self, i: int) -> None:
        if i in self._episodes:
            await self._episodes[i].close()


class DockerRollouts:
    """`docker run -d` a sleeping busybox, `docker exec` C times, `docker rm -f`."""

    def __init__(self, engine: Engine, tag: str) -> None:
        self._engine = engine
        self._tag = tag

    def _name(self, i: int) -> str:
        return f"corral-burst-{self._tag}-{i}"

    async def open(self, i: int) -> None:
        await self._engine.run(
            "run", "-d", "--network", "none", "--name", self._name(i), "busybox", "sleep", "3600"
        )

    async def call(self, i: int, n: int) -> None:
        out = await self._engine.run("exec", self._name(i), "echo", f"call-{n}")
        if out.strip() != f"call-{n}":
            raise RuntimeError(f"docker exec call {n} printed {out[:80]!r}")

    async def close(self, i: int) -> None:
        await self._engine.run("rm", "-f", self._name(i))


async def _count_waiting(corral: Corral, tag: str, stop: asyncio.Event, reasons: list[str]) -> int:
    """The most episodes of this bench seen in EpisodeState='waiting' at once;
    the distinct reasons they gave (up to MAX_REASONS) go into `reasons`."""
    query = f"EpisodeState = 'waiting' AND WorkflowId STARTS_WITH 'burst-{tag}-'"
    most = 0
    while not stop.is_set():
        with contextlib.suppress(RPCError):  # a visibility hiccup must not end the bench
            seen = (await corral.client.count_workflows(query)).count
            most = max(most, seen)
            if seen and len(reasons) < MAX_REASONS:
                await _note_reason(corral, query, reasons)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)
    return most


async def _note_reason(corral: Corral, query: str, reasons: list[str]) -> None:
    """Ask one waiting episode why it waits (it may have moved on: then nothing)."""
    async for listed in corral.client.list_workflows(query, limit=1):
        with contextlib.suppress(RPCError, CorralError):
            status = await corral.episode(listed.id).status()
            if status.state == "waiting" and status.reason not in reasons:
                reasons.append(status.reason)


async def run_burst(
    config: StackConfig,
    *,
    width: int = 128,
    calls: int = 5,
    in_flight: int = DEFAULT_IN_FLIGHT,
    docker: bool = True,
    tick: Callable[[], None] = lambda: None,
) -> BurstReport:
    tag = uuid.uuid4().hex[:8]
    corral = await Corral.connect(config)
    stop = asyncio.Event()
    reasons: list[str] = []
    watcher = asyncio.create_task(_count_waiting(corral, tag, stop, reasons))
    try:
        corral_side = await run_side(CorralRollouts(corral, tag), width, calls, in_flight, tick)
    finally:
        stop.set()
        max_waiting = await watcher
    docker_side, skipped = None, "not asked for (--no-docker)"
    if docker:
        docker_side, skipped = await _docker_side(config, tag, width, calls, in_flight, tick)
    return BurstReport(
        width=width,
        calls=calls,
        in_flight=in_flight,
        corral=corral_side,
        docker=docker_side,
        docker_skipped_because=skipped,
        max_waiting=max_waiting,
        waiting_reasons=reasons,
        ratios=_ratios(corral_side, docker_side),
        targets={"corral / docker wall_s": "<= 0.67", "corral / docker start_p99_ms": "<= 1.0"},
    )


async def _docker_side(
    config: StackConfig,
    tag: str,
    width: int,
    calls: int,
    in_flight: int,
    tick: Callable[[], None],
) -> tuple[BurstSide | None, str]:
    try:
        engine = await docker_engine(config.state)
    except EngineUnavailable as err:
        return None, str(err)
    try:
        side = await run_side(DockerRollouts(engine, tag), width, calls, in_flight, tick)
        return side, ""
    finally:
        await engine.close()


def _ratios(corral: BurstSide, docker: BurstSide | None) -> dict[str, float]:
    if docker is None:
        return {}
    return {
        "corral / docker wall_s": round(corral.wall_s / max(docker.wall_s, 1e-9), 3),
        "corral / docker start_p99_ms": round(
            corral.start_p99_ms / max(docker.start_p99_ms, 1e-9), 3
        ),
    }


def describe(report: BurstReport) -> list[str]:
    lines = [
        f"burst: {report.width} rollouts x {report.calls} calls, "
        f"{report.in_flight} requests in flight at most"
    ]
    sides = [("corral", report.corral), ("docker", report.docker)]
    for name, side in sides:
        if side is None:
            lines.append(f"{name:8s} skipped: {report.docker_skipped_because}")
            continue
        lines.append(
            f"{name:8s} wall {side.wall_s:7.2f} s  start p50 {side.start_p50_ms:8.1f} ms "
            f"p99 {side.start_p99_ms:8.1f} ms  call p50 {side.call_p50_ms:7.1f} ms "
            f"p99 {side.call_p99_ms:7.1f} ms  failures {side.failures}"
        )
        if side.first_failure:
            lines.append(f"{'':8s} first failure: {side.first_failure}")
    lines.append(f"most corral episodes waiting for a node at once: {report.max_waiting}")
    lines.extend(f"  waiting because: {reason}" for reason in report.waiting_reasons)
    for key, value in report.ratios.items():
        lines.append(f"{key:32s} {value:.3f}  (target {report.targets.get(key, '')})")
    return lines
