"""`corral bench --elastic` and the idle-sandbox machinery `--density` shares.

Elastic: B busy sandboxes run a CPU-bound step loop for a fixed window, alone,
then with M idle sandboxes beside them, then alone again (the two alone
windows are averaged against the machine's drifting load) (elastic CPU: weight 2 between
steps, full weight while a step runs, as the node activities do it). Reported:
`busy throughput with idle / alone` and how fast an idle sandbox's first step
after a quiet period starts, next to a busy sandbox's step (the difference of
the two p50 exec round trips of `true`). `--idle-spinning S` leaves a CPU-bound
background process in S of the idle sandboxes (an agent's forgotten server):
the case elastic weights exist for.

A benchmark, not a test: it asserts nothing; every sandbox it makes is
removed when it ends.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import Callable

from pydantic import BaseModel, Field

from contract.config import StackConfig
from contract.labels import BENCH_LABEL
from sandbox import BUSYBOX_IMAGE, Containerd, SandboxSpec
from sandbox.cgroups import IDLE_SHARES, ElasticCpu
from sandbox.sandbox import Sandbox

# One step of the busy loop: about 50-100 ms of one core in busybox sh here.
CPU_STEP = "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done"
SPIN = "while :; do :; done"
QUIET_S = 5.0  # how long idle sandboxes sit untouched before their first step
RATE_WINDOW = 250  # creations per point of the rate-over-time series


class RatePoint(BaseModel):
    """Creations `first`..`last` (1-based, in completion order) and their rate."""

    first: int
    last: int
    per_second: float


class IdleSet(BaseModel):
    ids: list[str] = Field(default_factory=list)
    failures: int = 0
    wall_s: float = 0.0
    rate: list[RatePoint] = Field(default_factory=list)


def idle_spec(tag: str, shim: int | None, command: list[str] | None = None) -> SandboxSpec:
    """An idle sandbox as the warm pool and elastic episodes have it (weight 2),
    in shim group `shim` (None: a shim of its own)."""
    return SandboxSpec(
        image=BUSYBOX_IMAGE,
        memory_mb=64,
        tmpfs_mb=8,
        cpu_shares=IDLE_SHARES,
        shim_group=f"idle-{tag}-{shim}" if shim is not None else None,
        labels={BENCH_LABEL: tag},
        **({"command": command} if command else {}),
    )


async def create_idle(
    raw: Containerd,
    n: int,
    *,
    group: int,
    concurrency: int = 4,
    spinning: int = 0,
    tick: Callable[[], None] = lambda: None,
) -> IdleSet:
    """Create `n` idle sandboxes, timing each completion for the rate over time.
    The first `spinning` of them run a CPU-bound loop as PID 1's child."""
    tag = uuid.uuid4().hex[:8]
    held = IdleSet()
    done_at: list[float] = []
    # Round-robin over the groups: a shim serves one Tasks.Create at a time (runc
    # shim v2 holds its service lock through runc create), so creates in flight at
    # once must land in different shims or they queue behind each other.
    groups = -(-n // group)

    def shim_of(i: int) -> int | None:
        return i % groups if group > 1 else None

    limit = asyncio.Semaphore(concurrency)

    async def make(i: int) -> None:
        sandbox_id = uuid.uuid4().hex * 2
        command = ["sh", "-c", SPIN] if i < spinning else None
        async with limit:
            try:
                await raw.create_sandbox(sandbox_id, idle_spec(tag, shim_of(i), command))
                held.ids.append(sandbox_id)
                done_at.append(time.perf_counter())
            except Exception:
                held.failures += 1
            tick()

    started = time.perf_counter()
    try:
        await asyncio.gather(*(make(i) for i in range(n)))
    except BaseException:  # interrupted: leave nothing behind
        await asyncio.shield(destroy_all(raw, held.ids))
        raise
    held.wall_s = round(time.perf_counter() - started, 2)
    held.rate = rate_over_time(started, done_at)
    return held


def rate_over_time(
    started: float, done_at: list[float], window: int = RATE_WINDOW
) -> list[RatePoint]:
    """Creations per second in consecutive windows of `window` completions."""
    points, previous = [], started
    for first in range(0, len(done_at), window):
        chunk = done_at[first : first + window]
        elapsed = chunk[-1] - previous
        points.append(
            RatePoint(
                first=first + 1,
                last=first + len(chunk),
                per_second=round(len(chunk) / elapsed, 2) if elapsed > 0 else 0.0,
            )
        )
        previous = chunk[-1]
    return points


async def destroy_all(raw: Containerd, ids: list[str], concurrency: int = 8) -> None:
    limit = asyncio.Semaphore(concurrency)

    async def one(sandbox_id: str) -> None:
        async with limit:
            await raw.destroy_sandbox(sandbox_id)

    await asyncio.gather(*(one(i) for i in ids))


class ElasticReport(BaseModel):
    busy: int
    idle: int
    idle_spinning: int
    window_s: float
    busy_steps_alone: int  # the mean of the windows before and after
    busy_steps_alone_windows: list[int]
    busy_steps_with_idle: int
    idle_created: int
    idle_create_wall_s: float
    idle_first_step_ms_p50: float
    busy_step_ms_p50: float
    ratios: dict[str, float]
    targets: dict[str, str]


async def run_elastic(
    config: StackConfig,
    *,
    idle: int,
    busy: int,
    spinning: int = 0,
    window_s: float = 20.0,
    group: int = 20,
    tick: Callable[[], None] = lambda: None,
) -> ElasticReport:
    """Busy throughput alone, beside `idle` idle sandboxes, alone again; idle first-step latency."""
    node = config.node_names()[0]
    async with await Containerd.connect(
        str(config.containerd_socket(node)), namespace=config.nodes.containerd_namespace
    ) as raw:
        workers = await create_idle(raw, busy, group=1)  # the busy ones: elastic, own shims
        held = IdleSet()
        try:
            boxes = [await raw.get_sandbox(i) for i in workers.ids]
            cpu = ElasticCpu()  # one per process, as on a node: it counts running steps
            before = await _busy_steps(cpu, boxes, window_s)
            held = await create_idle(raw, idle, group=group, spinning=spinning, tick=tick)
            created = len(held.ids)
            await asyncio.sleep(QUIET_S)
            beside = await _busy_steps(cpu, boxes, window_s)
            idle_ms, busy_ms = await _first_steps(raw, cpu, boxes, held, window_s)
            await destroy_all(raw, held.ids)
            held.ids = []  # removed; `idle_created` below was counted at creation
            # Alone again after: the mean of before and after cancels slow drift in
            # the rest of the machine's load (a shared machine is never quiet).
            after = await _busy_steps(cpu, boxes, window_s)
            alone = round((before + after) / 2)
        finally:
            await destroy_all(raw, workers.ids + held.ids)
    return ElasticReport(
        busy=busy,
        idle=idle,
        idle_spinning=spinning,
        window_s=window_s,
        busy_steps_alone=alone,
        busy_steps_alone_windows=[before, after],
        busy_steps_with_idle=beside,
        idle_created=created,
        idle_create_wall_s=held.wall_s,
        idle_first_step_ms_p50=idle_ms,
        busy_step_ms_p50=busy_ms,
        ratios={
            "busy throughput with idle / alone": round(beside / alone, 3) if alone else 0.0,
            "idle first step - busy step (ms, p50)": round(idle_ms - busy_ms, 1),
        },
        targets={
            "busy throughput with idle / alone": ">= 0.9 (5,000 idle, 20 busy)",
            "idle first step - busy step (ms, p50)": "<= 20",
        },
    )


async def _first_steps(
    raw: Containerd, cpu: ElasticCpu, boxes: list[Sandbox], held: IdleSet, window_s: float
) -> tuple[float, float]:
    """While the busy loop runs (uncounted: the samples cost CPU too), the first
    step of 20 idle sandboxes and a short step of busy ones: (idle p50, busy p50) ms."""
    loop = asyncio.create_task(_busy_steps(cpu, boxes, window_s))
    samples = held.ids[:: max(1, len(held.ids) // 20)][:20]
    idle_ms, busy_ms = [], []
    for index, sandbox_id in enumerate(samples):
        idle_ms.append(await _round_trip_ms(cpu, await raw.get_sandbox(sandbox_id)))
        busy_ms.append(await _round_trip_ms(cpu, boxes[index % len(boxes)]))
    await loop
    return _p50(idle_ms), _p50(busy_ms)


async def _busy_steps(cpu: ElasticCpu, boxes: list[Sandbox], window_s: float) -> int:
    """CPU-bound steps completed by all `boxes` in `window_s`, each under full weight."""
    deadline = time.monotonic() + window_s

    async def loop(box: Sandbox) -> int:
        steps = 0
        while time.monotonic() < deadline:
            with cpu.busy(box.id, box.labels):
                result = await box.exec(CPU_STEP)
            steps += result.exit_code == 0
        return steps

    return sum(await asyncio.gather(*(loop(box) for box in boxes)))


async def _round_trip_ms(cpu: ElasticCpu, box: Sandbox) -> float:
    started = time.perf_counter()
    with cpu.busy(box.id, box.labels):
        await box.exec(["true"])
    return (time.perf_counter() - started) * 1000


def _p50(values: list[float]) -> float:
    return round(statistics.median(values), 1) if values else 0.0
