"""`corral sim`: the control plane under a simulated fleet.

A stack of its own (role `control`: the real Temporal dev server, workflow
worker, intake and janitor schedule, in a temporary state directory on its
own ports) and, in this process, `nodes` simulated nodes (`corral/sim_node.py`),
each a real Temporal worker on its own node queue whose activities sleep
measured durations. Episodes arrive through the real SDK at `rate` a second
(Poisson) for `duration_s`; halfway through, the faults asked for strike.
Then it waits for every episode to close (or `grace_s`) and reports.

What is measured where: placement latency is from just before the SDK's
start call to the first activity reaching the node (so it includes the start
RPC, the first workflow task and the `corral.place` local activity); Temporal
CPU is the dev server process's user+system time over the run, heartbeats of
the whole fleet included; signals per workflow are the heartbeats the sim
sent to each registry shard, over the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC
from pathlib import Path

from pydantic import BaseModel, Field
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.runtime import (
    LogForwardingConfig,
    LoggingConfig,
    Runtime,
    TelemetryConfig,
    TelemetryFilter,
)
from temporalio.service import RPCError

from contract.config import StackConfig, load_config
from contract.errors import CorralError
from contract.models import EpisodeSpec, Step
from corral.sdk import Corral
from corral.sim_node import SimNode, SimStats, Timings
from workers.node_directory import NodeDirectory
from workers.stack import Stack
from workers.temporal import connect
from workflows.nodes import REGISTRY_SHARDS, registry_handle

DEFAULT_PORT_BASE = 25233  # a family no test stack uses (24233 is the TLS e2e stack's)
JOIN_TIMEOUT_S = 120.0
PARTITION_S = 40.0  # longer than the registry's lost verdict (20 s + one 5 s check)
SLOW_FACTOR = 10.0
OUTCOME_TRIES = 5
NODES_PER_CONNECTION = 100
JOIN_WAVE = 50  # nodes started a second
EVENT_ACTIVITY_STARTED = EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
BASELINE_S = 10.0  # the joined fleet with no episode: what heartbeats alone cost


class SimError(CorralError):
    """The simulation could not run (bad option, stack did not start)."""


class SimOptions(BaseModel):
    nodes: int = Field(ge=1, le=5000)
    sandboxes_per_node: int = Field(default=8, ge=1, le=10_000)
    rate: float = Field(default=5.0, gt=0, le=10_000)  # episode starts a second
    duration_s: float = Field(default=30.0, gt=0)
    steps: int = Field(default=5, ge=1, le=1000)
    kill_fraction: float = Field(default=0.0, ge=0, le=1)
    partition_fraction: float = Field(default=0.0, ge=0, le=1)
    slow_fraction: float = Field(default=0.0, ge=0, le=1)
    grace_s: float = Field(default=150.0, gt=0)  # after the last arrival, for all to close
    seed: int = 1
    port_base: int = Field(default=DEFAULT_PORT_BASE, ge=1024, le=65000)


class PlacementGaps(BaseModel):
    """One placement, cut at its history's events: which side it waited on."""

    episode_id: str
    submitted_at: float  # Unix time, to line it up with other clocks (CPU samples, logs)
    placement_ms: float  # the whole of it, as in slowest_placements
    start_call_ms: float  # the SDK's call until the server's WorkflowExecutionStarted
    to_workflow_task_ms: float  # until a workflow worker took the first task
    workflow_task_ms: float  # that task, with the `corral.place` local activity
    to_activity_ms: float  # until the first activity was scheduled (more tasks, if any)
    to_node_ms: float  # the activity scheduled until a node took it
    node_report_ms: float  # the node's activity started until the sim saw it
    signals_before: int  # signals in its history before its first activity (node_lost, ...)


class SimReport(BaseModel):
    nodes: int
    arrival_rate: float
    steps_per_episode: int
    started: int
    completed: int
    failed_node_lost: int  # failed with `node lost: <node>`: the trainer is told, not lost
    failed_other: int
    lost: int  # started but never closed normally (terminated, timed out, unknown)
    stuck: int  # still running when the grace ran out
    placement_p50_ms: float
    placement_p99_ms: float
    # The slowest placements: [seconds after the first arrival, ms]; the faults
    # strike at half the duration.
    slowest_placements: list[tuple[float, float]] = []
    # Where each of those waited, from its history (ms, the server's clock but the
    # first and last): see `PlacementGaps`.
    slowest_gaps: list[PlacementGaps] = []
    episodes_per_s: float
    temporal_cpu_ms_per_episode: float
    temporal_cpu_ms_per_step: float
    temporal_cpu_share: float  # of one core, over the run
    temporal_cpu_share_idle: float  # of one core, the fleet's heartbeats with no episode
    temporal_cpu_ms_per_episode_net: float  # the idle share taken out
    workflow_worker_cpu_ms_per_episode: float
    max_signals_per_s_per_workflow: float
    heartbeat_signals_per_s: float  # into all registry shards together
    registry_shards: int
    hottest_workflow: str
    hottest_history_events: int
    hottest_history_bytes: int
    episode_history_events: int  # median over a few completed episodes
    # From the histories of a sample of episodes: workflow started to the first
    # activity started on the node, the server's clock (no client-side lag).
    server_placement_p50_ms: float
    server_placement_p99_ms: float
    killed_nodes: int
    heartbeat_errors: int
    run_s: float


def sim_config(root: Path, state: Path, port_base: int) -> StackConfig:
    """A control-only stack on its own ports and state, as the fleet tests make one."""
    overrides = {
        "temporal": {
            "address": f"127.0.0.1:{port_base}",
            "dev_server": {"ui_port": port_base + 1, "metrics_port": port_base + 2},
        },
        "workers": {"metrics_port_base": port_base + 10, "warm_pool": ""},
        "intake": {"port": port_base + 3},
        "observability": {"traces": "none"},
    }
    stack_file = {"nodes": 1, "role": "control", "overrides": overrides}
    (state / "stack.json").write_text(json.dumps(stack_file))
    return load_config(root / "temporal-dev.yaml", env={"CORRAL_STATE_DIR": str(state)})


def cpu_ms(pid: int | None) -> float:
    """User + system CPU of a live process, in ms (0 when it is gone)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    return ticks * 1000.0 / os.sysconf("SC_CLK_TCK")


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 1)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run_sim(
    options: SimOptions, root: Path, say: Callable[[str], None] = lambda _m: None
) -> SimReport:
    state = Path(tempfile.mkdtemp(prefix="corral-sim-"))
    stack = Stack(sim_config(root, state, options.port_base))
    try:
        say("control plane (temporal, workflow worker, intake, janitor)")
        await stack.up(role="control")
        return await _run_with_stack(options, stack, say)
    finally:
        await stack.down()
        shutil.rmtree(state, ignore_errors=True)


async def _run_with_stack(
    options: SimOptions, stack: Stack, say: Callable[[str], None]
) -> SimReport:
    config = stack.config
    corral = await Corral.connect(config)
    stats = SimStats()
    rng = random.Random(options.seed)
    nodes = [
        SimNode(
            f"sim-{i:04d}",
            max_sandboxes=options.sandboxes_per_node,
            workflow_queue=config.workers.workflow_task_queue,
            timings=Timings(),
            stats=stats,
            seed=rng.randrange(1 << 30),
        )
        for i in range(options.nodes)
    ]
    say(f"{len(nodes)} simulated nodes")
    runtime = _quiet_runtime()
    for first in range(0, len(nodes), NODES_PER_CONNECTION):
        # Real nodes each have their own connection; a thousand long polls on one
        # HTTP/2 connection would queue every other call behind them.
        client = await connect(config, runtime=runtime)
        for wave in range(first, min(first + NODES_PER_CONNECTION, len(nodes)), JOIN_WAVE):
            for node in nodes[wave : wave + JOIN_WAVE]:
                node.start(client)
            # A fleet joins over time; a thousand signal-with-starts in one
            # second would be a drill of its own.
            await asyncio.sleep(1.0)
    try:
        await _wait_joined(corral.client, len(nodes))
        run = _Run(options, corral, nodes, stats, stack)
        return await run.measure(rng, say)
    finally:
        await asyncio.gather(*(node.stop() for node in nodes), return_exceptions=True)


def _quiet_runtime() -> Runtime:
    """The nodes' Temporal runtime: core's warnings to Python logging (stderr), never
    to stdout, which carries `--json`."""
    forward = LogForwardingConfig(logger=logging.getLogger("corral.sim.core"))
    quiet = TelemetryFilter(core_level="ERROR", other_level="ERROR")
    return Runtime(
        telemetry=TelemetryConfig(logging=LoggingConfig(filter=quiet, forwarding=forward))
    )


async def _wait_joined(client: Client, count: int) -> None:
    deadline = time.monotonic() + JOIN_TIMEOUT_S + count / JOIN_WAVE
    directory = NodeDirectory(client)  # a busy shard keeps its last answer
    ready = 0
    while time.monotonic() < deadline:
        with contextlib.suppress(RPCError):
            await directory.refresh()
        ready = sum(1 for n in directory.nodes() if n.state == "ready")
        if ready >= count:
            return
        await asyncio.sleep(1.0)
    waited = JOIN_TIMEOUT_S + count / JOIN_WAVE
    raise SimError(f"only {ready} of the {count} simulated nodes joined in {waited:.0f} s")


class _Run:
    def __init__(
        self,
        options: SimOptions,
        corral: Corral,
        nodes: list[SimNode],
        stats: SimStats,
        stack: Stack,
    ) -> None:
        self.options = options
        self.corral = corral
        self.nodes = nodes
        self.stats = stats
        self.stack = stack
        self.submitted: dict[str, float] = {}  # episode id -> monotonic, before the start call
        self.submitted_wall: dict[str, float] = {}  # the same moment, time.time()
        self.start_errors = 0
        self.killed = 0

    def _spec(self) -> EpisodeSpec:
        return EpisodeSpec(image="busybox", steps=[Step(cmd="true")] * self.options.steps)

    async def _start_one(self, episode_id: str) -> None:
        self.submitted[episode_id] = time.monotonic()
        self.submitted_wall[episode_id] = time.time()
        try:
            await self.corral.start_episode(self._spec(), episode_id=episode_id)
        except CorralError:
            self.start_errors += 1
            del self.submitted[episode_id]

    async def _arrivals(self, rng: random.Random) -> None:
        starts: list[asyncio.Task[None]] = []
        end = time.monotonic() + self.options.duration_s
        faults_at = time.monotonic() + self.options.duration_s / 2
        faulted = False
        while time.monotonic() < end:
            if not faulted and time.monotonic() >= faults_at:
                self._strike(rng)
                faulted = True
            episode_id = f"sim-ep-{len(starts):06d}"
            starts.append(asyncio.create_task(self._start_one(episode_id)))
            await asyncio.sleep(rng.expovariate(self.options.rate))
        await asyncio.gather(*starts)

    def _strike(self, rng: random.Random) -> None:
        """The faults, all at once: kills, a partition, slow nodes (disjoint sets)."""
        shuffled = rng.sample(self.nodes, len(self.nodes))
        kills = round(self.options.kill_fraction * len(shuffled))
        parts = round(self.options.partition_fraction * len(shuffled))
        slows = round(self.options.slow_fraction * len(shuffled))
        for node in shuffled[:kills]:
            node.kill()
        for node in shuffled[kills : kills + parts]:
            node.partition(PARTITION_S)
        for node in shuffled[kills + parts : kills + parts + slows]:
            node.slow_factor = SLOW_FACTOR
        self.killed = kills

    async def _open_episodes(self) -> int:
        """Episodes still running (-1: the server did not answer; ask again)."""
        query = "WorkflowType = 'EpisodeWorkflow' AND ExecutionStatus = 'Running'"
        try:
            return (await self.corral.client.count_workflows(query)).count
        except RPCError:  # an overloaded server times out: that is a finding, not a crash
            return -1

    async def _wait_closed(self) -> None:
        deadline = time.monotonic() + self.options.grace_s
        while time.monotonic() < deadline and await self._open_episodes():
            await asyncio.sleep(2.0)

    async def measure(self, rng: random.Random, say: Callable[[str], None]) -> SimReport:
        temporal_pid = self.stack.process("temporal").pid()
        worker_pid = self.stack.process("workflow-worker").pid()
        say(f"{BASELINE_S:.0f} s of the fleet alone")
        idle0 = cpu_ms(temporal_pid)
        await asyncio.sleep(BASELINE_S)
        idle_share = (cpu_ms(temporal_pid) - idle0) / (BASELINE_S * 1000.0)
        cpu0, worker0 = cpu_ms(temporal_pid), cpu_ms(worker_pid)
        signals0 = Counter(self.stats.signals)
        began = time.monotonic()
        say(f"episodes at {self.options.rate}/s for {self.options.duration_s:.0f} s")
        await self._arrivals(rng)
        say("waiting for every episode to close")
        await self._wait_closed()
        run_s = time.monotonic() - began
        temporal_cpu = cpu_ms(temporal_pid) - cpu0
        worker_cpu = cpu_ms(worker_pid) - worker0
        signals = Counter(self.stats.signals)
        signals.subtract(signals0)
        outcome = await self._outcomes()
        hottest, events, size = await self._hottest()
        episode_events = await self._episode_events()
        server_latencies = await self._server_latencies()
        started = len(self.submitted)
        placed_s = {  # start call -> first activity on a node, each placed episode
            ep: self.stats.first_activity[ep] - at
            for ep, at in self.submitted.items()
            if ep in self.stats.first_activity
        }
        latencies = [seconds * 1000.0 for seconds in placed_s.values()]
        slowest_ids = sorted(placed_s, key=placed_s.__getitem__, reverse=True)[:3]
        slowest = [(round(self.submitted[ep] - began, 1), _ms(placed_s[ep])) for ep in slowest_ids]
        gaps = [
            g for g in [await self._gaps(ep, placed_s[ep]) for ep in slowest_ids] if g is not None
        ]
        per_episode = temporal_cpu / max(started, 1)
        net = max(temporal_cpu - idle_share * run_s * 1000.0, 0.0) / max(started, 1)
        return SimReport(
            nodes=len(self.nodes),
            arrival_rate=self.options.rate,
            steps_per_episode=self.options.steps,
            started=started,
            completed=outcome["completed"],
            failed_node_lost=outcome["node_lost"],
            failed_other=outcome["failed"] + self.start_errors,
            lost=outcome["lost"],
            stuck=outcome["stuck"],
            placement_p50_ms=round(percentile(latencies, 0.50), 1),
            placement_p99_ms=round(percentile(latencies, 0.99), 1),
            slowest_placements=slowest,
            slowest_gaps=gaps,
            episodes_per_s=round(outcome["completed"] / run_s, 2),
            temporal_cpu_ms_per_episode=round(per_episode, 1),
            temporal_cpu_ms_per_step=round(per_episode / self.options.steps, 2),
            temporal_cpu_share=round(temporal_cpu / (run_s * 1000.0), 3),
            temporal_cpu_share_idle=round(idle_share, 3),
            temporal_cpu_ms_per_episode_net=round(net, 1),
            workflow_worker_cpu_ms_per_episode=round(worker_cpu / max(started, 1), 1),
            max_signals_per_s_per_workflow=round(max(signals.values(), default=0) / run_s, 2),
            heartbeat_signals_per_s=round(sum(signals.values()) / run_s, 1),
            registry_shards=sum(1 for count in signals.values() if count > 0),
            hottest_workflow=hottest,
            hottest_history_events=events,
            hottest_history_bytes=size,
            episode_history_events=episode_events,
            server_placement_p50_ms=round(percentile(server_latencies, 0.50), 1),
            server_placement_p99_ms=round(percentile(server_latencies, 0.99), 1),
            killed_nodes=self.killed,
            heartbeat_errors=self.stats.heartbeat_errors,
            run_s=round(run_s, 1),
        )

    async def _outcomes(self) -> Counter[str]:
        """How each started episode ended, from visibility (and the failure's cause)."""
        for _ in range(OUTCOME_TRIES - 1):
            with contextlib.suppress(RPCError):  # a busy server times out: ask again
                return await self._tally()
            await asyncio.sleep(5.0)
        return await self._tally()

    async def _tally(self) -> Counter[str]:
        tally: Counter[str] = Counter()
        seen: set[str] = set()
        client = self.corral.client
        async for execution in client.list_workflows("WorkflowType = 'EpisodeWorkflow'"):
            if execution.id not in self.submitted or execution.id in seen:
                continue
            seen.add(execution.id)
            tally[await self._outcome(execution.id, execution.status)] += 1
        tally["lost"] += len(set(self.submitted) - seen)
        return tally

    async def _outcome(self, episode_id: str, status: WorkflowExecutionStatus | None) -> str:
        if status == WorkflowExecutionStatus.COMPLETED:
            return "completed"
        if status == WorkflowExecutionStatus.RUNNING:
            return "stuck"
        if status != WorkflowExecutionStatus.FAILED:
            return "lost"  # terminated, timed out, cancelled: no answer for the trainer
        try:
            await self.corral.client.get_workflow_handle(episode_id).result()
        except WorkflowFailureError as err:
            cause = str(err.cause) if err.cause is not None else str(err)
            return "node_lost" if "node lost" in cause else "failed"
        return "failed"

    async def _server_latencies(self, sample: int = 100) -> list[float]:
        """Started -> first ActivityTaskStarted, in ms, for up to `sample` episodes."""
        latencies: list[float] = []
        for episode_id in list(self.submitted)[:: max(1, len(self.submitted) // sample)]:
            with contextlib.suppress(RPCError):
                history = await self.corral.client.get_workflow_handle(episode_id).fetch_history()
                started = history.events[0].event_time.ToDatetime()
                first = next(
                    (e for e in history.events if e.event_type == EVENT_ACTIVITY_STARTED), None
                )
                if first is not None:
                    gap = first.event_time.ToDatetime() - started
                    latencies.append(gap.total_seconds() * 1000.0)
        return latencies

    async def _gaps(self, episode_id: str, arrived: float) -> PlacementGaps | None:
        """Where one placement's time went (`arrived` s in all), from its history."""
        try:
            history = await self.corral.client.get_workflow_handle(episode_id).fetch_history()
        except RPCError:
            return None
        at: dict[int, float] = {}
        signals = 0
        for event in history.events:  # the first of each kind
            at.setdefault(event.event_type, event.event_time.ToDatetime(UTC).timestamp())
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
                signals += EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED not in at
        kinds = (
            EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED,
            EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED,
            EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED,
            EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,
            EVENT_ACTIVITY_STARTED,
        )
        if any(kind not in at for kind in kinds):
            return None
        started, task, done, scheduled, on_node = (at[kind] for kind in kinds)
        arrived_wall = self.submitted_wall[episode_id] + arrived
        return PlacementGaps(
            episode_id=episode_id,
            submitted_at=round(self.submitted_wall[episode_id], 2),
            placement_ms=_ms(arrived),
            start_call_ms=_ms(started - self.submitted_wall[episode_id]),
            to_workflow_task_ms=_ms(task - started),
            workflow_task_ms=_ms(done - task),
            to_activity_ms=_ms(scheduled - done),
            to_node_ms=_ms(on_node - scheduled),
            node_report_ms=_ms(arrived_wall - on_node),
            signals_before=signals,
        )

    async def _episode_events(self, sample: int = 5) -> int:
        """History length of completed episodes (the median of a few)."""
        query = "WorkflowType = 'EpisodeWorkflow' AND ExecutionStatus = 'Completed'"
        lengths: list[float] = []
        with contextlib.suppress(RPCError):
            async for execution in self.corral.client.list_workflows(query, limit=sample):
                lengths.append(float(execution.history_length or 0))
        return int(percentile(lengths, 0.5))

    async def _hottest(self) -> tuple[str, int, int]:
        """The registry shard with the longest current history (the hot workflows)."""
        best = ("", 0, 0)
        for shard in range(REGISTRY_SHARDS):
            handle = registry_handle(self.corral.client, shard)
            with contextlib.suppress(Exception):  # a shard no node hashed to
                info = (await handle.describe()).raw_description.workflow_execution_info
                if info.history_length > best[1]:
                    best = (handle.id, info.history_length, info.history_size_bytes)
        return best
