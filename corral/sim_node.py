"""One simulated node of `corral sim`: a real Temporal worker on `corral-node-<name>`.

It registers the activity names the episode and janitor workflows call
(`corral.provision`, `corral.run_scripted`, `corral.exec_step`, ...) with fakes
that sleep durations drawn from the measured distributions in `Timings`, and
it heartbeats to the node registry through the real `send_heartbeat`, with a
`NodeHeartbeat` that counts its fake sandboxes, and runs the real presence
activity (`activities/presence.py`) its registry shard arms on it. Everything on the other side
(Temporal, the workflow worker, registry, placement, admission, janitor) is
the real code, unchanged.

Faults: `kill` stops the node as a crash would (heartbeats end, presence
goes silent, no activity it holds or takes completes); `partition`
silences its heartbeats, signals and presence both, for a while; `slow`
multiplies every duration.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from temporalio import activity
from temporalio.client import Client
from temporalio.worker import Worker

from activities.presence import HEARTBEAT_THROTTLE, Presence
from contract.models import (
    ExecStepInput,
    FileContent,
    NodeCapacity,
    NodeHeartbeat,
    NodeUsage,
    ProvisionInput,
    ProvisionResult,
    ReadFileInput,
    ReapInput,
    ReapResult,
    RunScriptedInput,
    RunScriptedResult,
    SandboxRef,
    StepResult,
    TeardownInput,
    TeardownResult,
    WriteFileInput,
)
from workers.heartbeat import next_tick
from workflows.nodes import HEARTBEAT_EVERY_S, BeatGate, registry_id, send_heartbeat, shard_of

SIM_IMAGE = "corral.local/busybox:latest"


@dataclass(frozen=True)
class Timings:
    """Medians (ms) and log-normal spreads of one node's work, from docs/benchmarks.md:
    a cold provision activity 120 ms, a raw exec round trip 45 ms (p99 73 ms),
    a destroy about half a create."""

    create_ms: float = 120.0
    step_ms: float = 45.0
    teardown_ms: float = 60.0
    sigma: float = 0.25  # exp(2.33 * 0.25) = 1.8: p99 about 1.8 x the median

    def draw(self, median_ms: float, rng: random.Random, factor: float = 1.0) -> float:
        """A duration in seconds."""
        return median_ms * factor * math.exp(rng.gauss(0.0, self.sigma)) / 1000.0


@dataclass
class SimStats:
    """What every simulated node of one run reports, shared by all of them."""

    first_activity: dict[str, float] = field(default_factory=dict)  # workflow id -> monotonic
    signals: Counter[str] = field(default_factory=Counter)  # registry workflow id -> count
    heartbeat_errors: int = 0


class SimNode:
    def __init__(
        self,
        name: str,
        *,
        max_sandboxes: int,
        workflow_queue: str,
        timings: Timings,
        stats: SimStats,
        seed: int,
    ) -> None:
        self.name = name
        self.task_queue = f"corral-node-{name}"
        self._max_sandboxes = max_sandboxes
        self._workflow_queue = workflow_queue
        self._timings = timings
        self._stats = stats
        self._rng = random.Random(seed)
        self._sandboxes: set[str] = set()
        self._busy = 0
        self.slow_factor = 1.0
        self.dead = False
        self._silent_until = 0.0  # monotonic: heartbeats paused (a partition) until then
        self._worker: Worker | None = None
        self._beats: asyncio.Task[None] | None = None
        self._gate = BeatGate()  # the node worker's rule: news, or the keep-alive
        self._boot = f"{self._rng.randrange(1 << 48):012x}"
        self.presence = Presence(silenced=lambda: time.monotonic() < self._silent_until)

    # ------------------------------------------------------------ lifecycle
    def activities(self) -> list[Callable[..., object]]:
        return [
            self.provision,
            self.run_scripted,
            self.exec_step,
            self.write_file,
            self.read_file,
            self.teardown,
            self.freeze,
            self.thaw,
            self.reap_orphans,
            *self.presence.activities(),
        ]

    def start(self, client: Client) -> None:
        # One poller per node: a thousand nodes share one process and two cores.
        self._worker = Worker(
            client,
            task_queue=self.task_queue,
            activities=self.activities(),
            max_concurrent_activities=self._max_sandboxes * 2,
            max_concurrent_activity_task_polls=1,
            max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,  # as a node worker's
        )
        self._worker_run = asyncio.create_task(self._worker.run())
        self._beats = asyncio.create_task(self._heartbeat_forever(client))

    async def stop(self) -> None:
        if self._beats is not None:
            self._beats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._beats
        if self._worker is not None:
            await self._worker.shutdown()  # a dead node's hung fakes are cancelled here

    def kill(self) -> None:
        """A crash: silent at once, nothing it holds or takes ever completes. Its
        worker is not shut down: a shutdown says `NodeStopping` for presence and
        cancels each running activity, a storm of reports a crashed host never
        sends (a hundred at once cost the dev server about 5 core-seconds). Its
        presence times out instead, and the registry's `node_lost` ends its
        episodes."""
        self.dead = True
        self._silent_until = math.inf
        if self._beats is not None:
            self._beats.cancel()

    def partition(self, seconds: float) -> None:
        """Its heartbeats stop reaching the registry for `seconds`; work goes on."""
        self._silent_until = time.monotonic() + seconds

    # ------------------------------------------------------------ heartbeat
    def heartbeat(self) -> NodeHeartbeat:
        count = len(self._sandboxes)
        return NodeHeartbeat(
            name=self.name,
            task_queue=self.task_queue,
            version="sim",
            capacity=NodeCapacity(
                cores=16.0,
                memory_mb=64 * 1024,
                pids=100_000,
                max_sandboxes=self._max_sandboxes,
            ),
            use=NodeUsage(sandboxes=count, busy=self._busy, memory_mb=count * 16, pids=count * 4),
            images=[SIM_IMAGE],
            host="sim",
            boot=self._boot,
        )

    async def _heartbeat_forever(self, client: Client) -> None:
        # Spread the first beats over one period, as nodes started at different times are.
        await asyncio.sleep(self._rng.uniform(0.0, HEARTBEAT_EVERY_S))
        tick = time.monotonic()
        while True:
            if tick >= self._silent_until:
                await self._beat(client, tick)
            tick = await next_tick(tick)

    async def _beat(self, client: Client, tick: float) -> None:
        beat = self.heartbeat()
        if not self._gate.due(beat, tick, self.presence.armed):
            return
        try:
            await send_heartbeat(client, self._workflow_queue, beat)
            self._gate.sent(beat, tick)
            self._stats.signals[registry_id(shard_of(self.name))] += 1
        except asyncio.CancelledError:
            raise
        except Exception:  # counted; the next beat is tried as a node worker would
            self._stats.heartbeat_errors += 1

    # ------------------------------------------------------------ the fakes
    def _arrived(self) -> None:
        if self.dead:  # a crashed host takes nothing: not a placement that arrived
            return
        workflow_id = activity.info().workflow_id or ""
        self._stats.first_activity.setdefault(workflow_id, time.monotonic())

    async def _hang_if_dead(self) -> None:
        if self.dead:  # it crashed: no answer, ever (stop() cancels it)
            await asyncio.Event().wait()

    async def _sleep(self, median_ms: float) -> float:
        seconds = self._timings.draw(median_ms, self._rng, self.slow_factor)
        await asyncio.sleep(seconds)
        await self._hang_if_dead()
        return seconds

    async def _create(self, request: ProvisionInput) -> ProvisionResult:
        self._arrived()
        seconds = await self._sleep(self._timings.create_ms)
        created = request.sandbox_id not in self._sandboxes
        self._sandboxes.add(request.sandbox_id)
        return ProvisionResult(
            sandbox_id=request.sandbox_id, node=self.name, provision_s=seconds, created=created
        )

    async def _step(self, index: int, cmd: str) -> StepResult:
        self._busy += 1
        try:
            started = datetime.now(UTC)
            seconds = await self._sleep(self._timings.step_ms)
        finally:
            self._busy -= 1
        return StepResult(
            index=index, cmd=cmd, exit_code=0, duration_s=seconds, started_at=started, sensor="off"
        )

    async def _destroy(self, sandbox_id: str) -> float:
        seconds = await self._sleep(self._timings.teardown_ms)
        self._sandboxes.discard(sandbox_id)
        return seconds

    @activity.defn(name="corral.provision")
    async def provision(self, request: ProvisionInput) -> ProvisionResult:
        return await self._create(request)

    @activity.defn(name="corral.run_scripted")
    async def run_scripted(self, request: RunScriptedInput) -> RunScriptedResult:
        made = await self._create(request.provision)
        steps = [
            await self._step(request.first_index + i, _cmd(step.cmd))
            for i, step in enumerate(request.steps)
        ]
        reward = None
        if request.reward is not None:
            reward = await self._step(len(steps), _cmd(request.reward.cmd))
            reward.source = "reward"
        # Destroyed after the result returns, off the episode's path, as on a node.
        self._later = asyncio.create_task(self._destroy(made.sandbox_id))
        return RunScriptedResult(provision=made, steps=steps, reward=reward)

    @activity.defn(name="corral.exec_step")
    async def exec_step(self, request: ExecStepInput) -> StepResult:
        result = await self._step(request.index, _cmd(request.step.cmd))
        result.source = request.source
        return result

    @activity.defn(name="corral.write_file")
    async def write_file(self, request: WriteFileInput) -> None:
        await self._sleep(self._timings.step_ms / 4)

    @activity.defn(name="corral.read_file")
    async def read_file(self, request: ReadFileInput) -> FileContent:
        await self._sleep(self._timings.step_ms / 4)
        return FileContent(path=request.request.path, content_b64="", size=0)

    @activity.defn(name="corral.teardown")
    async def teardown(self, request: TeardownInput) -> TeardownResult:
        seconds = await self._destroy(request.sandbox_id)
        return TeardownResult(sandbox_id=request.sandbox_id, removed=True, teardown_s=seconds)

    @activity.defn(name="corral.freeze")
    async def freeze(self, ref: SandboxRef) -> None:
        await self._sleep(self._timings.step_ms / 4)

    @activity.defn(name="corral.thaw")
    async def thaw(self, ref: SandboxRef) -> None:
        await self._sleep(self._timings.step_ms / 4)

    @activity.defn(name="corral.reap_orphans")
    async def reap_orphans(self, request: ReapInput) -> ReapResult:
        await self._hang_if_dead()
        return ReapResult(node=self.name, checked=len(self._sandboxes), removed=[])


def _cmd(cmd: str | list[str]) -> str:
    return cmd if isinstance(cmd, str) else " ".join(cmd)
