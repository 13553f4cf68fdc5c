"""Measurements for the policy path: alert-to-frozen latency and sensor overhead.

Both run against a live stack and print nothing by themselves; the slow test
``tests/integration/policies/test_measure.py`` prints their numbers and
``docs/policies.md`` records them. No thresholds: the machines are noisy.

* :func:`alert_to_frozen` starts interactive episodes, runs one write below
  ``/bin`` in each and polls the node's containerd until the sandbox's task is
  ``paused``. The clock starts when the exec request is sent (so the exec
  round trip through Temporal is included) and stops at the first poll that
  sees ``paused``: sensor -> intake -> signal -> freeze activity, end to end.
* :func:`sensor_overhead` times an exec-heavy loop (``/bin/true`` N times,
  each a fork and an execve) in one sandbox with no sensor, then with an
  in-process sensor and the rule engine evaluating every event, in
  interleaved rounds; the fastest run of each side is compared. Stop the
  stack's own node sensors first, or "off" is not off.

The trainer SDK (``corral.Corral``) is passed in, not imported: ``policies``
sits below ``corral`` in the layering.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import statistics
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from contract.errors import CorralError
from policies.falco.engine import RuleEngine
from policies.falco.event import ContainerInfo, Event
from policies.falco.fields import default_registry
from policies.runner import Say, new_sandbox_id

POLL_S = 0.005


def exec_heavy_step(n: int) -> str:
    """A shell step that forks and execs ``/bin/true`` n times."""
    return f"i=0; while [ $i -lt {n} ]; do /bin/true; i=$((i+1)); done"


def open_heavy_step(n: int) -> str:
    """A shell step that opens a file to read and one to write n times (no exec)."""
    return (f"i=0; while [ $i -lt {n} ]; do read x < /etc/hostname; : > /tmp/corral-open; "
            f"i=$((i+1)); done")  # fmt: skip


def percentile(data: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100)."""
    xs = sorted(data)
    if not xs:
        return float("nan")
    k = max(0, min(len(xs) - 1, math.ceil(p / 100 * len(xs)) - 1))
    return xs[k]


@dataclass
class LatencyReport:
    samples_ms: list[float] = field(default_factory=list)
    missed: int = 0  # runs where the sandbox never froze within the cap

    @property
    def p50_ms(self) -> float:
        return percentile(self.samples_ms, 50)

    @property
    def p99_ms(self) -> float:
        return percentile(self.samples_ms, 99)

    def line(self) -> str:
        n = len(self.samples_ms)
        if not n:
            return f"alert-to-frozen: no samples (missed {self.missed})"
        lo, hi = min(self.samples_ms), max(self.samples_ms)
        missed = f", missed {self.missed}" if self.missed else ""
        return (f"alert-to-frozen over {n} runs: p50 {self.p50_ms:.0f} ms, "
                f"p99 {self.p99_ms:.0f} ms, min {lo:.0f} ms, max {hi:.0f} ms{missed}")  # fmt: skip


async def alert_to_frozen(
    corral: Any,
    config: Any,
    *,
    runs: int = 20,
    node: str | None = None,
    cap_s: float = 30.0,
    say: Say = lambda _m: None,
) -> LatencyReport:
    """Offending exec sent -> sandbox paused, over ``runs`` fresh episodes."""
    from sandbox import Containerd

    report = LatencyReport()
    clients: dict[str, Any] = {}
    try:
        for i in range(runs):
            ep = await corral.start_episode({"image": "busybox", "interactive": True}, node=node)
            try:
                status = await _wait_state(ep, "running", cap_s)
                if status.node not in clients:
                    clients[status.node] = await Containerd.connect(
                        str(config.containerd_socket(status.node)),
                        namespace=config.nodes.containerd_namespace,
                    )
                sandbox = await clients[status.node].get_sandbox(status.sandbox_id)
                t0 = time.monotonic()
                exec_task = asyncio.create_task(ep.exec(f"echo x > /bin/corral-measure-{i}"))
                frozen = False
                while time.monotonic() - t0 < cap_s:
                    if await sandbox.status() == "paused":
                        frozen = True
                        break
                    await asyncio.sleep(POLL_S)
                elapsed_ms = (time.monotonic() - t0) * 1000
                with contextlib.suppress(Exception):
                    await exec_task
                if frozen:
                    report.samples_ms.append(elapsed_ms)
                    say(f"run {i + 1}/{runs}: frozen after {elapsed_ms:.0f} ms")
                else:
                    report.missed += 1
                    say(f"run {i + 1}/{runs}: not frozen within {cap_s:g} s")
            finally:
                with contextlib.suppress(Exception):
                    await ep.kill(reason="measurement done", by="policies.measure")
                with contextlib.suppress(Exception):
                    await ep.result()
    finally:
        for client in clients.values():
            await client.close()
    return report


async def _wait_state(ep: Any, state: str, cap_s: float) -> Any:
    deadline = time.monotonic() + cap_s
    while True:
        status = await ep.status()
        if status.state == state:
            return status
        if time.monotonic() > deadline:
            raise TimeoutError(f"episode {ep.id} not {state} within {cap_s:g} s ({status.state})")
        await asyncio.sleep(0.05)


@dataclass
class OverheadReport:
    execs: int
    off_s: list[float]
    on_s: list[float]
    events_seen: int = 0  # past the prefilter: evaluated by the engine
    matches: int = 0
    records_seen: int = 0  # kernel records the sensor read while on

    @property
    def off_min_s(self) -> float:
        return min(self.off_s)

    @property
    def on_min_s(self) -> float:
        return min(self.on_s)

    @property
    def overhead_pct(self) -> float:
        """From the fastest run of each: on a shared, noisy machine the minimum is
        the run least disturbed by other work."""
        return (self.on_min_s / self.off_min_s - 1) * 100

    @property
    def overhead_median_pct(self) -> float:
        return (statistics.median(self.on_s) / statistics.median(self.off_s) - 1) * 100

    def line(self) -> str:
        return (f"sensor overhead, {self.execs} fork+execs of /bin/true in one exec "
                f"({len(self.on_s)} runs each, interleaved): off min "
                f"{self.off_min_s * 1000:.0f} ms / median "
                f"{statistics.median(self.off_s) * 1000:.0f} ms, on min "
                f"{self.on_min_s * 1000:.0f} ms / median "
                f"{statistics.median(self.on_s) * 1000:.0f} ms: {self.overhead_pct:+.1f}% "
                f"(min), {self.overhead_median_pct:+.1f}% (median); {self.records_seen} "
                f"records read, {self.events_seen} events evaluated")  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "overhead_pct": self.overhead_pct,
                "overhead_median_pct": self.overhead_median_pct}  # fmt: skip


async def sensor_overhead(
    config: Any,
    rule_paths: Sequence[str | Path],
    *,
    node: str | None = None,
    execs: int = 500,
    repeats: int = 5,
    rounds: int = 2,
    say: Say = lambda _m: None,
) -> OverheadReport:
    """Wall time of the exec-heavy loop with the sensor off, then on, ``rounds`` times
    (interleaved, so drift in the machine's load hits both sides)."""
    from policies.runner import SandboxResolver, start_sensor
    from sandbox import Containerd, SandboxSpec

    engine = RuleEngine.from_files(
        [Path(p) for p in rule_paths], default_registry(), strict=True, rule_matching="first"
    )
    node = node or config.node_names()[0]
    loop = exec_heavy_step(execs)
    sandbox_id = new_sandbox_id()
    counter = _Counter(engine, sandbox_id)
    resolver = SandboxResolver()
    resolver.containers[sandbox_id] = ContainerInfo(full_id=sandbox_id, image="busybox")
    off: list[float] = []
    on: list[float] = []
    records = 0
    async with await Containerd.connect(
        str(config.containerd_socket(node)), namespace=config.nodes.containerd_namespace
    ) as client:
        try:
            sandbox = await client.create_sandbox(
                sandbox_id, SandboxSpec(image="busybox", pids_limit=512),
                labels={"corral.measure": uuid.uuid4().hex[:8]},
            )  # fmt: skip
            await sandbox.exec(loop)  # warm up
            for r in range(rounds):
                batch = [await _timed(sandbox, loop) for _ in range(repeats)]
                say(f"round {r + 1} sensor off: {[round(x * 1000) for x in batch]} ms")
                off += batch
                sensor = await start_sensor(engine, resolver, counter.on_event, say)
                try:
                    batch = [await _timed(sandbox, loop) for _ in range(repeats)]
                    records += sensor.stats.records
                finally:
                    await sensor.stop()
                say(f"round {r + 1} sensor on: {[round(x * 1000) for x in batch]} ms")
                on += batch
        finally:
            with contextlib.suppress(CorralError):
                await client.destroy_sandbox(sandbox_id)
    return OverheadReport(execs, off, on, counter.events, counter.matches, records)


class _Counter:
    """A sensor callback that evaluates every event of one sandbox (like a node sensor)."""

    def __init__(self, engine: RuleEngine, full_id: str) -> None:
        self.engine = engine
        self.full_id = full_id
        self.events = 0
        self.matches = 0

    def on_event(self, evt: Event) -> None:
        if evt.container is None or evt.container.full_id != self.full_id:
            return
        self.events += 1
        self.matches += len(self.engine.evaluate(evt))


async def _timed(sandbox: Any, cmd: str) -> float:
    t0 = time.monotonic()
    result = await sandbox.exec(cmd, timeout_s=300)
    if result.exit_code != 0:
        raise RuntimeError(f"exec-heavy loop exited {result.exit_code}: {result.stderr[:200]}")
    return time.monotonic() - t0
