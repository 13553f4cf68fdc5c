"""`corral bench --sensor`: what the built-in sensor costs next to the work it watches.

One busybox sandbox on the first node runs two steps, each several times,
with the sensor off and on in interleaved rounds (so drift in the machine's
load hits both sides):

* exec-heavy: ``/bin/true`` N times (a fork and an execve each);
* open-heavy: N shell redirections, one read and one write open each.

"On" is the node sensor's pipeline in this process: the tracer, the parser
and prefilter, and the rule engine evaluating every event that passes, in
a thread of its own so that its CPU time is its own (``time.thread_time``),
plus the tracer's CPU from ``/proc``. The tracer is the backend the stack
runs (``sensor.backend``; ``CORRAL_SENSOR_BACKEND=bpftrace|libbpf`` picks
one, to compare): bpftrace, or the compiled libbpf loader; ``backend`` in
the report says which ran. The workload's CPU is its cgroup's
``cpuacct.usage``. Reported, per step (medians over the rounds):

* ``sensor cpu / workload cpu``: sensor CPU in an "on" run over the
  workload's CPU in an "off" run (the probes themselves run in the
  workload's syscalls, so they show in ``workload_cpu_on_s`` instead);
* ``wall slowdown``: the step's wall time on over off;
* records and events per second the sensor handled.

Every sensor on the machine traces every sandbox under ``/corral``: other
stacks' sensors (``other_sensors``: bpftrace and libbpf loader processes)
make "off" less than off, and other sandboxes' syscalls reach this sensor
too. ``own_share`` is the bench sandbox's share of the records (by their
cgroup id), and ``... (own records only)`` charges the sensor's CPU to the
step by that share. A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from contract.config import StackConfig
from contract.errors import CorralError
from contract.labels import BENCH_LABEL
from corral.bench.peers import _process_cpu_s
from policies.falco.engine import RuleEngine
from policies.falco.event import ContainerInfo, Event
from policies.falco.fields import default_registry
from policies.measure import exec_heavy_step, open_heavy_step
from policies.sensor import libbpf as lb
from policies.sensor import program as pg
from policies.sensor.cgroups import DictResolver, parent_dir
from policies.sensor.prefilter import Prefilter, needs_exe_details
from policies.sensor.sensor import Sensor
from sandbox import BUSYBOX_IMAGE, Containerd, SandboxSpec

CPUACCT = Path("/sys/fs/cgroup/cpuacct/corral")
HEADER_RECORDS = frozenset({pg.REC_SYSCALL, pg.REC_EXEC_ENTER, pg.REC_EXEC_EXIT, pg.REC_FORK,
                            pg.REC_EXIT})  # fmt: skip
TRACER_COMM = lb.LOADER[:15]  # the kernel keeps 15 characters of a process name
READY_TIMEOUT_S = 300.0  # bpftrace compiles for tens of seconds on a busy machine


class StepResult(BaseModel):
    name: str
    command: str
    syscalls_per_run: int  # the step's own execs or opens
    wall_off_s: list[float]
    wall_on_s: list[float]
    workload_cpu_off_s: list[float]
    workload_cpu_on_s: list[float]
    sensor_cpu_s: list[float]  # python thread + tracer, per "on" run
    tracer_cpu_s: list[float]  # bpftrace's or the libbpf loader's
    records: list[int]  # tracer records the sensor parsed, per "on" run
    events: list[int]  # events that passed the prefilter and were evaluated
    own_share: list[float]  # of the records, the bench sandbox's (the rest: other sandboxes)
    sensor_cpu_ratio: float
    own_sensor_cpu_ratio: float  # the sensor CPU share of the bench sandbox's records
    wall_slowdown: float
    records_per_s: float
    events_per_s: float


class SensorBenchReport(BaseModel):
    backend: str  # the tracer that ran: bpftrace or libbpf
    rounds: int
    n: int
    other_sensors: int  # tracer processes of other stacks tracing the same sandboxes
    load_avg_1m: float
    steps: list[StepResult]
    ratios: dict[str, float]
    targets: dict[str, str]


class _SensorThread:
    """The sensor pipeline on an event loop in its own thread (its CPU is measurable)."""

    def __init__(
        self, engine: RuleEngine, resolver: DictResolver, sandbox_cgid: int, backend: str
    ) -> None:
        self.engine = engine
        self.backend = backend
        self.resolver = resolver
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="bench-sensor")
        self.sensor: Sensor | None = None
        self.evaluated = 0
        self.sandbox_cgid = sandbox_cgid
        self.headers = 0  # records that name a cgroup: syscall, exec, fork, exit
        self.own_headers = 0  # ... of the bench's sandbox

    def _count(self, record: Callable[[list[Any]], Event | None]) -> Any:
        """Wrap the parser's record(): which records are the bench sandbox's?"""

        def counted(d: list[Any]) -> Event | None:
            if d[0] in HEADER_RECORDS:
                self.headers += 1
                self.own_headers += d[4] == self.sandbox_cgid
            return record(d)

        return counted

    def _on_event(self, evt: Event) -> None:
        self.evaluated += 1
        self.engine.evaluate(evt)

    async def _call(self, coro: Any) -> Any:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    async def start(self) -> None:
        self.thread.start()
        await self._call(self._start())

    async def _start(self) -> None:
        prefilter = Prefilter(self.engine)
        self.sensor = Sensor(self.engine.event_types(), resolver=self.resolver,
                             prefilter=prefilter,
                             exe_details=needs_exe_details(self.engine),
                             backend=self.backend)  # fmt: skip
        self.sensor.add_callback(self._on_event)
        self.sensor.parser.record = self._count(self.sensor.parser.record)  # type: ignore[method-assign]
        await self.sensor.start()
        await self.sensor.wait_ready(READY_TIMEOUT_S)

    async def sample(self) -> tuple[float, float, int, int, int]:
        """This thread's CPU, the tracer's, records so far, header records, the sandbox's."""
        thread_cpu = await self._call(self._thread_time())
        assert self.sensor is not None
        proc = self.sensor._proc
        tracer = _process_cpu_s(proc.pid) if proc is not None else 0.0
        records = self.sensor.parser.stats.records
        return thread_cpu, tracer, records, self.headers, self.own_headers

    async def _thread_time(self) -> float:
        return time.thread_time()

    async def stop(self) -> None:
        if self.sensor is not None:
            with contextlib.suppress(Exception):
                await self._call(self.sensor.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        await asyncio.to_thread(self.thread.join)
        self.loop.close()


def _cgroup_cpu_s(sandbox_id: str) -> float:
    return int((CPUACCT / sandbox_id / "cpuacct.usage").read_text()) / 1e9


def _other_sensors() -> int:
    mine = os.getpid()
    count = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            text = stat.read_text()
            ppid = int(text.rsplit(")", 1)[1].split()[1])
            tracer = "(bpftrace)" in text or f"({TRACER_COMM})" in text
            if tracer and ppid != mine:
                count += 1
    return count


async def _timed(sandbox: Any, cmd: str, sandbox_id: str) -> tuple[float, float]:
    cpu0, t0 = _cgroup_cpu_s(sandbox_id), time.monotonic()
    result = await sandbox.exec(cmd, timeout_s=600)
    wall, cpu = time.monotonic() - t0, _cgroup_cpu_s(sandbox_id) - cpu0
    if result.exit_code != 0:
        raise CorralError(f"bench step exited {result.exit_code}: {result.stderr[:200]}")
    return wall, cpu


async def _run_on(
    sensor: _SensorThread, sandbox: Any, cmd: str, sandbox_id: str
) -> tuple[float, float, float, float, int, int, float]:
    py0, bt0, rec0, hdr0, own0 = await sensor.sample()
    ev0 = sensor.evaluated
    wall, cpu = await _timed(sandbox, cmd, sandbox_id)
    await asyncio.sleep(0.5)  # let the sensor drain what the step produced
    py1, bt1, rec1, hdr1, own1 = await sensor.sample()
    tracer = bt1 - bt0
    own_share = (own1 - own0) / max(1, hdr1 - hdr0)
    return (wall, cpu, py1 - py0 + tracer, tracer, rec1 - rec0, sensor.evaluated - ev0,
            own_share)  # fmt: skip


def _summarize(name: str, cmd: str, n: int, runs: dict[str, list[Any]]) -> StepResult:
    med = statistics.median
    wall_on = med(runs["wall_on"])
    return StepResult(
        name=name, command=cmd, syscalls_per_run=n,
        wall_off_s=runs["wall_off"], wall_on_s=runs["wall_on"],
        workload_cpu_off_s=runs["cpu_off"], workload_cpu_on_s=runs["cpu_on"],
        sensor_cpu_s=runs["sensor"], tracer_cpu_s=runs["tracer"],
        records=runs["records"], events=runs["events"],
        own_share=runs["own_share"],
        sensor_cpu_ratio=med(runs["sensor"]) / med(runs["cpu_off"]),
        own_sensor_cpu_ratio=med(
            [c * share for c, share in zip(runs["sensor"], runs["own_share"], strict=True)]
        ) / med(runs["cpu_off"]),
        wall_slowdown=wall_on / med(runs["wall_off"]),
        records_per_s=med(runs["records"]) / wall_on,
        events_per_s=med(runs["events"]) / wall_on,
    )  # fmt: skip


async def run_sensor(
    config: StackConfig,
    *,
    n: int = 1000,
    rounds: int = 3,
    tick: Callable[[], None] = lambda: None,
    backend: str | None = None,
) -> SensorBenchReport:
    """Both steps, sensor off then on, ``rounds`` times; the sandbox is always removed.
    ``backend``: the stack's ``sensor.backend`` unless given."""
    backend = backend or config.sensor.backend
    ran: list[str] = []
    engine = RuleEngine.from_files(
        [config.resolve(p) for p in config.sensor.rules], default_registry(),
        strict=True, rule_matching="first",
    )  # fmt: skip
    node = config.node_names()[0]
    sandbox_id = uuid.uuid4().hex * 2
    resolver = DictResolver({sandbox_id: ContainerInfo(full_id=sandbox_id, image=BUSYBOX_IMAGE)})
    steps = {"exec-heavy": exec_heavy_step(n), "open-heavy": open_heavy_step(n)}
    runs: dict[str, dict[str, list[Any]]] = {k: {} for k in steps}
    others = _other_sensors()
    async with await Containerd.connect(
        str(config.containerd_socket(node)), namespace=config.nodes.containerd_namespace
    ) as client:
        try:
            sandbox = await client.create_sandbox(
                sandbox_id, SandboxSpec(image=BUSYBOX_IMAGE, pids_limit=512),
                labels={BENCH_LABEL: "sensor"},
            )  # fmt: skip
            for cmd in steps.values():
                await sandbox.exec(cmd, timeout_s=600)  # warm up
            for _ in range(rounds):
                ran.append(
                    await _round(engine, resolver, sandbox, sandbox_id, steps, runs, tick, backend)
                )
        finally:
            with contextlib.suppress(CorralError):
                await client.destroy_sandbox(sandbox_id)
    results = [_summarize(k, steps[k], n, runs[k]) for k in steps]
    return SensorBenchReport(
        backend="+".join(sorted(set(ran))), rounds=rounds, n=n, other_sensors=others,
        load_avg_1m=os.getloadavg()[0],
        steps=results, ratios=_ratios(results),
        targets={"sensor cpu / workload cpu": "<= 0.10 on exec-heavy steps"},
    )  # fmt: skip


async def _round(
    engine: RuleEngine,
    resolver: DictResolver,
    sandbox: Any,
    sandbox_id: str,
    steps: dict[str, str],
    runs: dict[str, dict[str, list[Any]]],
    tick: Callable[[], None],
    backend: str,
) -> str:
    """One round; returns the backend that ran (auto may have fallen back)."""
    for name, cmd in steps.items():
        wall, cpu = await _timed(sandbox, cmd, sandbox_id)
        runs[name].setdefault("wall_off", []).append(wall)
        runs[name].setdefault("cpu_off", []).append(cpu)
        tick()
    cgid = (parent_dir() / sandbox_id).stat().st_ino
    sensor = _SensorThread(engine, resolver, cgid, backend)
    try:
        await sensor.start()
        for name, cmd in steps.items():
            values = await _run_on(sensor, sandbox, cmd, sandbox_id)
            keys = ("wall_on", "cpu_on", "sensor", "tracer", "records", "events", "own_share")
            for key, value in zip(keys, values, strict=True):
                runs[name].setdefault(key, []).append(value)
            tick()
        assert sensor.sensor is not None
        return str(sensor.sensor.active_backend)
    finally:
        await sensor.stop()


def _ratios(results: list[StepResult]) -> dict[str, float]:
    by_name = {r.name: r for r in results}
    exec_step, open_step = by_name["exec-heavy"], by_name["open-heavy"]
    return {
        "sensor cpu / workload cpu": round(exec_step.sensor_cpu_ratio, 3),
        "sensor cpu / workload cpu (open-heavy)": round(open_step.sensor_cpu_ratio, 3),
        "sensor cpu / workload cpu (own records only)": round(exec_step.own_sensor_cpu_ratio, 3),
        "wall slowdown": round(exec_step.wall_slowdown, 3),
        "wall slowdown (open-heavy)": round(open_step.wall_slowdown, 3),
    }


def describe(report: SensorBenchReport) -> list[str]:
    lines = [f"sensor bench ({report.backend}): {report.rounds} rounds of {report.n} per step, "
             f"{report.other_sensors} other sensors on this machine, "
             f"load {report.load_avg_1m:.1f}"]  # fmt: skip
    for s in report.steps:
        med = statistics.median
        lines.append(
            f"{s.name:10s} off {med(s.wall_off_s):.2f} s wall / {med(s.workload_cpu_off_s):.2f}"
            f" s cpu; on {med(s.wall_on_s):.2f} s / sensor {med(s.sensor_cpu_s):.3f} s cpu "
            f"(tracer {med(s.tracer_cpu_s):.3f}); {s.records_per_s:.0f} records/s, "
            f"{s.events_per_s:.0f} events/s evaluated"
        )
    lines += [f"{k:40s} {v}" for k, v in report.ratios.items()]
    return lines
