"""`corral bench --peers`: Corral beside `ctr`, `podman` and `docker`, in one run.

Each peer runs the same job as a one-step episode: create a busybox
container, run `echo hi`, remove it. docker and podman are brought by the
bench (corral/bench/engines.py: a private dockerd when none answers, podman
on storage of its own, busybox imported from Corral's rootfs); a peer that is
not installed, or whose engine cannot be had, is skipped with the reason. The
Corral series come from `corral.bench.core.run_bench` in the same run, twice: with
the warm pool serving the episodes, and with a spec shape the pool does not
serve (the cold path). CPU per episode is read from /proc around the cold
and warm episode series, split by process.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from pydantic import BaseModel

from contract.config import StackConfig
from corral.bench.core import SPACED_SERIES, BenchReport, Series, _measure, _ratio, run_bench
from corral.bench.engines import (
    PEER_IMAGE,
    Engine,
    EngineUnavailable,
    docker_engine,
    podman_engine,
)
from sandbox import BUSYBOX_IMAGE
from workers.stack import Stack

CLK_TCK = os.sysconf("SC_CLK_TCK")
# Pause before each run of the spaced series: long enough for a Corral node to
# finish the last episode's deferred teardown and pool refill (~0.3 s of CPU).
SPACING_S = 1.0
PODMAN_PEER = "podman run --rm --network none"
DOCKER_PEER = "docker run --rm --network none"


class PeerResult(BaseModel):
    name: str
    available: bool
    skipped_because: str = ""
    sequential: Series | None = None
    concurrent: Series | None = None
    spaced: Series | None = None  # one at a time, SPACING_S apart


class PeersReport(BaseModel):
    corral: BenchReport  # the warm-pool-served episode series
    corral_cold: BenchReport  # the same with a shape the pool does not serve
    peers: list[PeerResult]
    ratios: dict[str, float]
    ratios_cold: dict[str, float]
    cpu_ms_per_episode: dict[str, float]
    cpu_ms_per_episode_cold: dict[str, float]
    # The same accounting around the raw lifecycles: the floor the sandbox
    # itself costs (runc, shim, containerd) without Temporal or the sensor.
    cpu_ms_per_raw_lifecycle: dict[str, float]
    targets: dict[str, str]


# ----------------------------------------------------------------- peers
def _ctr_argv(config: StackConfig, node: str) -> list[str] | None:
    ctr = shutil.which("ctr")
    if ctr is None:
        return None
    return [
        ctr,
        "-a",
        str(config.containerd_socket(node)),
        "-n",
        config.nodes.containerd_namespace,
        "run",
        "--rm",
        BUSYBOX_IMAGE,
    ]


async def _run(argv: list[str]) -> None:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[0]} exited {proc.returncode}: {err.decode()[-300:]}")


async def _engine_answers(argv: list[str]) -> str:
    """'' when the engine answers, else why not (one line)."""
    try:
        await _run(argv)
        return ""
    except (RuntimeError, OSError) as err:
        return " ".join(str(err).split())[:200]


async def _peer(
    name: str,
    run_argv: Callable[[str], list[str]] | None,
    probe: list[str] | None,
    n: int,
    concurrency: int,
    tick: Callable[[], None],
) -> PeerResult:
    if run_argv is None or probe is None:
        return PeerResult(name=name, available=False, skipped_because=f"{name} is not installed")
    why = await _engine_answers(probe)
    if why:
        return PeerResult(name=name, available=False, skipped_because=why)

    async def one(i: int) -> None:
        await _run(run_argv(f"peer-{uuid.uuid4().hex[:10]}"))

    sequential = await _measure(f"{name} (sequential)", n, 1, one, tick)
    concurrent = await _measure(f"{name} ({concurrency} in flight)", n, concurrency, one, tick)
    spaced = await _measure(
        f"{name} (spaced)", n, 1, one, tick, prepare=lambda: asyncio.sleep(SPACING_S)
    )
    return PeerResult(
        name=name, available=True, sequential=sequential, concurrent=concurrent, spaced=spaced
    )


async def _engine_peer(
    name: str,
    bring: Callable[[Path], Awaitable[Engine]],
    config: StackConfig,
    n: int,
    concurrency: int,
    tick: Callable[[], None],
) -> PeerResult:
    """`<engine> run --rm --network none busybox echo hi` on an engine the bench brings
    (corral/bench/engines.py: a private dockerd, podman on storage of its own)."""
    try:
        engine = await bring(config.state)
    except EngineUnavailable as err:
        return PeerResult(name=name, available=False, skipped_because=str(err))
    try:
        return await _peer(
            name,
            lambda cid: engine.run_argv(
                "--rm", "--network", "none", "--name", cid, PEER_IMAGE, "echo", "hi"
            ),
            [*engine.argv, "image", "inspect", PEER_IMAGE],
            n,
            concurrency,
            tick,
        )
    finally:
        await engine.close()


async def _peers(
    config: StackConfig, n: int, concurrency: int, tick: Callable[[], None]
) -> list[PeerResult]:
    ctr = _ctr_argv(config, config.node_names()[0])
    ctr_run = (lambda cid: [*ctr, cid, "echo", "hi"]) if ctr else None
    ctr_probe = [*ctr, f"probe-{uuid.uuid4().hex[:6]}", "true"] if ctr else None
    return [
        await _peer("ctr run --rm", ctr_run, ctr_probe, n, concurrency, tick),
        await _engine_peer(PODMAN_PEER, podman_engine, config, n, concurrency, tick),
        await _engine_peer(DOCKER_PEER, docker_engine, config, n, concurrency, tick),
    ]


# ------------------------------------------------------------------- CPU
def _process_cpu_s(pid: int) -> float:
    """utime + stime of a process and its reaped children (runc, ...)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    utime, stime, cutime, cstime = (int(fields[i]) for i in (11, 12, 13, 14))
    return (utime + stime + cutime + cstime) / CLK_TCK


def _busy_cpu_s() -> float:
    """Every core's non-idle time since boot."""
    parts = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = parts[3] + parts[4]
    return (sum(parts[:8]) - idle) / CLK_TCK


def _stack_pids(config: StackConfig) -> dict[str, list[int]]:
    stack = Stack(config)
    nodes = config.node_names()
    groups: dict[str, list[int | None]] = {
        "temporal server": [stack.process("temporal").pid()],
        "workflow worker": [stack.process("workflow-worker").pid()],
        "node worker": [stack.process(f"node-worker-{n}").pid() for n in nodes],
        "containerd": [stack.daemon(n).pid for n in nodes],
        "sensor": [stack.process(f"sensor-{n}").pid() for n in nodes],
    }
    return {group: [pid for pid in pids if pid is not None] for group, pids in groups.items()}


class CpuMeter:
    """CPU seconds each stack process spent between `start` and `stop`; the
    rest of the machine's busy time is shims, runc and the kernel (and, on a
    shared machine, everything else that ran meanwhile)."""

    def __init__(self, config: StackConfig) -> None:
        self._pids = _stack_pids(config)
        self._before: dict[str, float] = {}
        self._after: dict[str, float] = {}

    def _read(self) -> dict[str, float]:
        by_group = {g: sum(_process_cpu_s(p) for p in pids) for g, pids in self._pids.items()}
        return {**by_group, "machine busy": _busy_cpu_s()}

    def start(self) -> None:
        self._before = self._read()

    def stop(self) -> None:
        self._after = self._read()

    def per_episode_ms(self, episodes: int) -> dict[str, float]:
        after = self._after
        delta = {k: after[k] - self._before.get(k, 0.0) for k in after}
        known = sum(v for k, v in delta.items() if k != "machine busy")
        delta["shims, runc, kernel and the rest"] = max(delta.pop("machine busy") - known, 0.0)
        count = max(episodes, 1)
        per = {k: round(v * 1000 / count, 1) for k, v in delta.items()}
        node_side = ("node worker", "containerd", "shims, runc, kernel and the rest")
        per["node side (worker + containerd + shims + runc)"] = round(
            sum(per[k] for k in node_side), 1
        )
        return per


# ---------------------------------------------------------------- report
def _peer_ratios(report: BenchReport, peers: list[PeerResult]) -> dict[str, float]:
    by_name = {s.name: s for s in report.series}
    episode, raw = by_name["episode through Temporal"], by_name["raw containerd lifecycle"]
    # Latency as peers are timed, one at a time; throughput at the same concurrency.
    alone = by_name.get("episode through Temporal (sequential)", episode)
    raw_exec = by_name["raw exec round trip"]
    update = by_name["exec round trip through a Temporal Update"]
    ratios = {
        "episode throughput / raw throughput": _ratio(episode.per_second, raw.per_second),
        "update exec p50 / raw exec p50": _ratio(update.p50_ms, raw_exec.p50_ms),
    }
    peer = {p.name.split()[0]: p for p in peers if p.available}
    for key in ("docker", "podman", "ctr"):
        found = peer.get(key)
        if found and found.sequential and found.concurrent:
            ratios[f"episode p50 / {key} p50"] = _ratio(alone.p50_ms, found.sequential.p50_ms)
            ratios[f"episode throughput / {key} throughput"] = _ratio(
                episode.per_second, found.concurrent.per_second
            )
        spaced = by_name.get(SPACED_SERIES)
        if found and found.spaced and spaced:
            ratios[f"spaced episode p50 / spaced {key} p50"] = _ratio(
                spaced.p50_ms, found.spaced.p50_ms
            )
    return ratios


async def run_peers(
    config: StackConfig,
    *,
    n: int,
    concurrency: int,
    exec_n: int,
    tick: Callable[[], None] = lambda: None,
) -> PeersReport:
    peers = await _peers(config, n, concurrency, tick)
    meters = {name: CpuMeter(config) for name in ("warm", "cold", "raw")}
    warm = await run_bench(
        config,
        n=n,
        concurrency=concurrency,
        exec_n=exec_n,
        tick=tick,
        meter=meters["warm"],
        sequential=True,
        spaced_s=SPACING_S,
    )
    cold = await run_bench(
        config,
        n=n,
        concurrency=concurrency,
        exec_n=exec_n,
        tick=tick,
        meter=meters["cold"],
        raw_meter=meters["raw"],
        cold=True,
        sequential=True,
        spaced_s=SPACING_S,
    )
    episodes = n
    return PeersReport(
        corral=warm,
        corral_cold=cold,
        peers=peers,
        ratios=_peer_ratios(warm, peers),
        ratios_cold=_peer_ratios(cold, peers),
        cpu_ms_per_episode=meters["warm"].per_episode_ms(episodes),
        cpu_ms_per_episode_cold=meters["cold"].per_episode_ms(episodes),
        cpu_ms_per_raw_lifecycle=meters["raw"].per_episode_ms(episodes),
        targets={
            "episode p50 / docker p50": "<= 0.5",
            "episode p50 / ctr p50": "<= 1.0",
            "episode throughput / docker throughput": ">= 2.0",
            "episode throughput / raw throughput": ">= 0.8",
            "update exec p50 / raw exec p50": "<= 2.0",
            "node side (worker + containerd + shims + runc) ms per cold episode": "<= 100",
        },
    )


def describe_peers(report: PeersReport) -> list[str]:
    from corral.bench.core import describe

    lines = ["== warm pool serving the episodes", *describe(report.corral)]
    lines += ["== cold path (a shape the pool does not serve)", *describe(report.corral_cold)]
    lines.append("== peers")
    for peer in report.peers:
        if not peer.available:
            lines.append(f"{peer.name:45s} skipped: {peer.skipped_because}")
            continue
        for s in (peer.sequential, peer.concurrent, peer.spaced):
            if s is None:
                continue
            lines.append(
                f"{s.name:45s} {s.per_second:7.2f}/s  p50 {s.p50_ms:7.1f} ms  failures {s.failures}"
            )
    for title, ratios in (("warm", report.ratios), ("cold", report.ratios_cold)):
        lines.append(f"== ratios ({title})")
        for name, value in ratios.items():
            target = report.targets.get(name, "")
            lines.append(f"{name:45s} {value:7.3f}  {('target ' + target) if target else ''}")
    for title, cpu in (
        ("warm", report.cpu_ms_per_episode),
        ("cold", report.cpu_ms_per_episode_cold),
        ("raw lifecycle, no Temporal", report.cpu_ms_per_raw_lifecycle),
    ):
        lines.append(f"== CPU ms per episode ({title})")
        lines += [f"{k:50s} {v:7.1f}" for k, v in cpu.items()]
    return lines
