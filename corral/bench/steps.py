"""`corral bench --steps`: tool calls per second, Corral beside `docker exec` and `ctr task exec`.

The measurement (issue 21): N sandboxes x M calls, all sandboxes at once, one
call at a time per sandbox (as an agent drives its sandbox), each call `echo
hi`. Every side runs the same work on the same machine in the same run:

- `corral`: N interactive busybox episodes on the stack this command points
  at, M `episode.exec` each (an Update, an activity, the sensor's watermark).
  The path a call takes is the stack's: through the exec agent when its node
  workers run with `workers.exec_agent` (CORRAL_EXEC_AGENT=1), else runc exec;
  `exec_path` says which. The bench does not change the stack.
- `sandbox_agent` / `sandbox_runc`: the same calls straight at the node's
  containerd through `sandbox/` (no Temporal, no sensor wait), with the agent
  as PID 1 and without: the floor of each path, whatever the stack runs.
- `ctr`: `ctr task exec` on N runc sandboxes of the same busybox image, on the
  same containerd (ctr is a peer here only; the product never uses it).
- `docker`: `docker exec` on N busybox containers; the engine and its image
  come from corral/bench/engines.py (a private dockerd when none answers, the
  same busybox rootfs Corral builds). Skipped, with the reason, when docker
  is not installed.

CPU per step is all of the machine's busy CPU over the side's run divided by
its calls (on a shared machine that includes everyone else's work). A
benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel
from temporalio.service import RPCError, RPCStatusCode

from contract.config import StackConfig
from contract.ids import calls_workflow_id
from contract.labels import BENCH_LABEL
from corral.bench.core import _percentile, _ratio
from corral.bench.engines import PEER_IMAGE, EngineUnavailable, docker_engine
from corral.bench.peers import CpuMeter, _busy_cpu_s
from corral.sdk import Corral, Episode
from sandbox.agent import agent_binary
from sandbox.client import Containerd
from sandbox.models import SandboxSpec
from sandbox.oci_archive import build_busybox_image
from sandbox.sandbox import Sandbox

NAMESPACE = "corral-bench-steps"  # the sandbox-layer and ctr sides' own namespace
SINGLE_CALLS = 20  # the one-at-a-time series on an otherwise idle sandbox
# "Unloaded": the series starts once the machine uses under a tenth of a core
# over half a second (at most 20 s after the sandboxes were made).
QUIET_WINDOW_S = 0.5
QUIET_MAX_S = 20.0
QUIET_CORES = 0.1
EXPECTED = "hi\n"
Call = Callable[[int], Awaitable[str]]  # sandbox index -> the call's stdout


@dataclass(frozen=True)
class Plan:
    sandboxes: int  # N, all driven at once
    calls: int  # M per sandbox, one at a time
    single_calls: int  # the unloaded series, one sandbox
    tick: Callable[[], None]


class StepSide(BaseModel):
    name: str
    available: bool = True
    skipped_because: str = ""
    path: str = ""  # how a call reaches the sandbox
    calls: int = 0
    failures: int = 0  # calls that raised or whose output was not "hi\n"
    wall_s: float = 0.0
    steps_per_s: float = 0.0
    step_p50_ms: float = 0.0
    step_p90_ms: float = 0.0
    single_call_p50_ms: float = 0.0  # one call at a time, nothing else of the bench running
    settled_s: float = 0.0  # the wait for a quiet machine before that series
    cpu_ms_per_step: float = 0.0  # all of the machine's busy CPU / calls
    temporal_cpu_ms_per_step: float | None = None  # Corral only: the Temporal server's share
    history_events_per_step: float | None = None  # Corral only
    cpu_ms_per_step_by_process: dict[str, float] = {}


class StepsReport(BaseModel):
    sandboxes: int
    calls_per_sandbox: int
    corral: StepSide
    docker: StepSide
    ctr: StepSide
    sandbox_agent: StepSide
    sandbox_runc: StepSide
    ratios: dict[str, float]
    targets: dict[str, str]
    load_average: tuple[float, float, float]


# ------------------------------------------------------------- measuring
async def _concurrent(side: StepSide, plan: Plan, call: Call) -> None:
    """N loops at once, M calls each; fills the side's rates and machine CPU."""
    latencies: list[float] = []

    async def loop(index: int) -> None:
        for _ in range(plan.calls):
            started = time.perf_counter()
            try:
                ok = await call(index) == EXPECTED
            except Exception:
                ok = False
            if ok:
                latencies.append(time.perf_counter() - started)
            else:
                side.failures += 1
            plan.tick()

    busy, started = _busy_cpu_s(), time.perf_counter()
    await asyncio.gather(*(loop(i) for i in range(plan.sandboxes)))
    side.wall_s = round(time.perf_counter() - started, 3)
    busy = _busy_cpu_s() - busy
    ms = sorted(x * 1000 for x in latencies)
    side.calls = plan.sandboxes * plan.calls
    side.steps_per_s = round(len(ms) / side.wall_s, 2) if side.wall_s else 0.0
    side.step_p50_ms = round(statistics.median(ms), 2) if ms else 0.0
    side.step_p90_ms = round(_percentile(ms, 0.90), 2)
    side.cpu_ms_per_step = round(busy * 1000 / side.calls, 2)


async def _settled(
    window_s: float = QUIET_WINDOW_S, max_s: float = QUIET_MAX_S, busy_cores: float = QUIET_CORES
) -> float:
    """Wait until the machine is quiet: less than `busy_cores` of CPU over a
    window (the sandboxes just made, their workflows' starts and the warm
    pool's refill are done), or `max_s`. The seconds waited."""
    started = time.perf_counter()
    while time.perf_counter() - started < max_s:
        before = _busy_cpu_s()
        await asyncio.sleep(window_s)
        if (_busy_cpu_s() - before) / window_s < busy_cores:
            break
    return round(time.perf_counter() - started, 2)


async def _single(side: StepSide, call: Call, count: int) -> None:
    """One call at a time on the first sandbox, once the machine has settled
    after making the sandboxes: the latency of an unloaded call."""
    side.settled_s = await _settled()
    ms: list[float] = []
    for _ in range(count):
        started = time.perf_counter()
        with contextlib.suppress(Exception):
            if await call(0) == EXPECTED:
                ms.append((time.perf_counter() - started) * 1000)
    side.single_call_p50_ms = round(statistics.median(ms), 2) if ms else 0.0


async def _measure(side: StepSide, plan: Plan, call: Call) -> StepSide:
    await _single(side, call, plan.single_calls)
    await _concurrent(side, plan, call)
    return side


# ------------------------------------------------------------- Corral
async def _corral_side(config: StackConfig, plan: Plan) -> StepSide:
    path = "exec agent" if config.workers.exec_agent else "runc exec"
    side = StepSide(
        name="corral episode.exec", path=f"Temporal Update + local activity on the node, {path}"
    )
    corral = await Corral.connect(config)
    tag = uuid.uuid4().hex[:8]
    spec = {"image": "busybox", "interactive": True, "labels": {"bench": tag}}
    episodes = await asyncio.gather(
        *(
            corral.start_episode(spec, episode_id=f"bench-steps-{tag}-{i}")
            for i in range(plan.sandboxes)
        )
    )
    try:

        async def call(index: int) -> str:
            return (await episodes[index].exec(["echo", "hi"])).stdout

        await asyncio.gather(*(call(i) for i in range(plan.sandboxes)))  # made; not measured
        await _single(side, call, plan.single_calls)
        before = [await _history_length(corral, e) for e in episodes]
        meter = CpuMeter(config)
        meter.start()
        await _concurrent(side, plan, call)
        meter.stop()
        after = [await _history_length(corral, e) for e in episodes]
    finally:
        await asyncio.gather(*(e.finish() for e in episodes), return_exceptions=True)
    per = meter.per_episode_ms(side.calls)
    side.temporal_cpu_ms_per_step = per.get("temporal server", 0.0)
    side.cpu_ms_per_step_by_process = per
    side.history_events_per_step = round((sum(after) - sum(before)) / side.calls, 2)
    return side


async def _history_length(corral: Corral, episode: Episode) -> int:
    """Events of the episode and of its calls workflow (workflows/calls.py)."""
    total = 0
    for workflow_id in (episode.id, calls_workflow_id(episode.id)):
        try:
            history = await corral.client.get_workflow_handle(workflow_id).fetch_history()
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise
            continue  # no calls workflow: the calls went to the episode
        total += len(history.events)
    return total


# ------------------------------------------------------- sandbox layer
async def _sandbox_side(config: StackConfig, plan: Plan, agent: bool) -> StepSide:
    name = "sandbox layer, exec agent" if agent else "sandbox layer, runc exec"
    side = StepSide(name=name, path="sandbox/ straight at containerd, no Temporal")
    if agent and not agent_binary().is_file():
        return _skipped(side, f"no exec agent at {agent_binary()} (scripts/setup.sh builds it)")
    async with _sandboxes(config, plan.sandboxes, agent=agent) as boxes:

        async def call(index: int) -> str:
            return (await boxes[index].exec(["echo", "hi"])).stdout

        return await _measure(side, plan, call)


@contextlib.asynccontextmanager
async def _sandboxes(config: StackConfig, n: int, *, agent: bool) -> AsyncIterator[list[Sandbox]]:
    """N busybox sandboxes in the bench's namespace on the first node; removed after."""
    socket = str(config.containerd_socket(config.node_names()[0]))
    client = await Containerd.connect(socket, namespace=NAMESPACE, exec_agent=agent)
    ids = [f"bench-steps-{uuid.uuid4().hex[:10]}" for _ in range(n)]
    try:
        image = await build_busybox_image(client)
        spec = SandboxSpec(image=image.name, labels={BENCH_LABEL: "steps"})
        boxes: list[Sandbox] = []
        for sandbox_id in ids:
            boxes.append(await client.create_sandbox(sandbox_id, spec, spec.labels))
        yield boxes
    finally:
        for sandbox_id in ids:
            with contextlib.suppress(Exception):
                await client.destroy_sandbox(sandbox_id)
        await client.close()


# ------------------------------------------------------------------ ctr
async def _ctr_side(config: StackConfig, plan: Plan) -> StepSide:
    side = StepSide(name="ctr task exec", path="ctr task exec on runc sandboxes, same containerd")
    ctr = shutil.which("ctr")
    if ctr is None:
        return _skipped(side, "ctr is not installed")
    base = [ctr, "-a", str(config.containerd_socket(config.node_names()[0])), "-n", NAMESPACE]
    async with _sandboxes(config, plan.sandboxes, agent=False) as boxes:

        async def call(index: int) -> str:
            exec_id = f"e{uuid.uuid4().hex[:12]}"
            argv = [*base, "task", "exec", "--exec-id", exec_id, boxes[index].id, "echo", "hi"]
            return await _output(argv)

        return await _measure(side, plan, call)


# --------------------------------------------------------------- docker
async def _docker_side(config: StackConfig, plan: Plan) -> StepSide:
    side = StepSide(name="docker exec", path="docker exec on busybox containers, --network none")
    try:
        engine = await docker_engine(config.state)  # brings a daemon and busybox if needed
    except EngineUnavailable as err:
        return _skipped(side, str(err))
    names = [f"corral-bench-steps-{uuid.uuid4().hex[:8]}" for _ in range(plan.sandboxes)]
    try:
        for name in names:
            await engine.run(
                "run", "-d", "--network", "none", "--name", name, PEER_IMAGE, "sleep", "3600"
            )

        async def call(index: int) -> str:
            return await engine.run("exec", names[index], "echo", "hi")

        return await _measure(side, plan, call)
    finally:
        with contextlib.suppress(RuntimeError, OSError):
            await engine.run("rm", "-f", *names)
        await engine.close()


# -------------------------------------------------------------- helpers
async def _output(argv: list[str]) -> str:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{Path(argv[0]).name} exited {proc.returncode}: {err.decode()[-300:]}")
    return out.decode()


def _skipped(side: StepSide, why: str) -> StepSide:
    side.available, side.skipped_because = False, why
    return side


def _load_average() -> tuple[float, float, float]:
    one, five, fifteen = Path("/proc/loadavg").read_text().split()[:3]
    return float(one), float(five), float(fifteen)


# ------------------------------------------------------------------ run
async def run_steps(
    config: StackConfig,
    *,
    sandboxes: int,
    calls: int,
    single_calls: int = SINGLE_CALLS,
    tick: Callable[[], None] = lambda: None,
) -> StepsReport:
    """Every side in turn, peers first; `single_calls`: the unloaded series' length."""
    load = _load_average()  # before the bench adds its own
    plan = Plan(sandboxes, calls, single_calls, tick)
    docker = await _docker_side(config, plan)
    ctr = await _ctr_side(config, plan)
    agent = await _sandbox_side(config, plan, agent=True)
    runc = await _sandbox_side(config, plan, agent=False)
    corral = await _corral_side(config, plan)
    return StepsReport(
        sandboxes=sandboxes,
        calls_per_sandbox=calls,
        corral=corral,
        docker=docker,
        ctr=ctr,
        sandbox_agent=agent,
        sandbox_runc=runc,
        ratios=_ratios(corral, docker, ctr),
        targets={
            "corral / docker steps_per_s": ">= 2.0",
            "corral / ctr steps_per_s": ">= 1.5",
            "corral cpu_ms_per_step": "<= 20",
            "corral single_call_p50_ms": "<= 15",
            "corral history_events_per_step": "<= 6",
        },
        load_average=load,
    )


def _ratios(corral: StepSide, docker: StepSide, ctr: StepSide) -> dict[str, float]:
    ratios: dict[str, float] = {}
    for key, peer in (("docker", docker), ("ctr", ctr)):
        if peer.available:
            ratios[f"corral / {key} steps_per_s"] = _ratio(corral.steps_per_s, peer.steps_per_s)
    return ratios


def describe(report: StepsReport) -> list[str]:
    lines = [
        f"{report.sandboxes} sandboxes x {report.calls_per_sandbox} calls, one at a time each; "
        f"load average before: {report.load_average[0]:.2f}"
    ]
    sides = (report.corral, report.docker, report.ctr, report.sandbox_agent, report.sandbox_runc)
    for side in sides:
        if not side.available:
            lines.append(f"{side.name:28s} skipped: {side.skipped_because}")
            continue
        extra = ""
        if side.history_events_per_step is not None:
            extra = (
                f"  temporal {side.temporal_cpu_ms_per_step:.1f} ms"
                f"  events {side.history_events_per_step:.1f}"
            )
        lines.append(
            f"{side.name:28s} {side.steps_per_s:7.1f}/s  p50 {side.step_p50_ms:6.1f} ms  "
            f"p90 {side.step_p90_ms:6.1f} ms  alone p50 {side.single_call_p50_ms:6.1f} ms  "
            f"cpu {side.cpu_ms_per_step:6.1f} ms/step  failures {side.failures}{extra}"
        )
    for name, value in report.ratios.items():
        lines.append(f"{name:28s} {value:7.3f}  target {report.targets.get(name, '')}")
    return lines
