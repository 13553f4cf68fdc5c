"""`corral bench --defense`: what the user namespace, the disk quota and IO limits cost.

Raw create+start on one node's containerd (no Temporal), for four spec
variants taken in turn round after round so that a noisy machine hits them
alike: everything off, user namespace only, quota (with IO limits) only, and
the defaults (all on). Then density: N idle sandboxes held with everything
off and with the defaults, twice each in the order off, defaults, defaults,
off (the kernel's cleanup after one hold slows the next, whichever it is),
memory per sandbox and creations per second.
Ratios are defaults (or one feature) over everything off: 1.0 is free.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from contract.config import StackConfig
from contract.labels import BENCH_LABEL
from corral.bench.core import _memory_used_mb, _percentile, _ratio
from corral.bench.elastic import destroy_all
from sandbox import BUSYBOX_IMAGE, Containerd, SandboxSpec
from sandbox.spec import cgroups_path

OFF: dict[str, Any] = {"user_namespace": False, "disk_mb": None, "io_bps_mb": None, "io_iops": None}
VARIANTS: dict[str, dict[str, Any]] = {
    "off": OFF,
    "userns": {**OFF, "user_namespace": True},
    "quota": {"user_namespace": False},
    "defaults": {},
}
SETTLE_S = 2.0
DENSITY_ORDER = ("off", "defaults", "defaults", "off")
CGROUP_MEMORY = Path("/sys/fs/cgroup/memory")


class DensityFigures(BaseModel):
    created: int
    failures: int
    wall_s: float
    per_second: float
    memory_per_sandbox_mb: float  # host-wide MemAvailable delta: noisy on a shared machine
    cgroup_memory_per_sandbox_mb: float  # the sandboxes' own memory cgroups: robust


class DefenseReport(BaseModel):
    n: int
    density_n: int
    create_start_p50_ms: dict[str, float]
    create_start_p90_ms: dict[str, float]
    density: dict[str, list[DensityFigures]]  # per variant, in the order held
    ratios: dict[str, float]
    targets: dict[str, str]


def variant_spec(tag: str, index: int, variant: str, group: int = 1) -> SandboxSpec:
    """A small idle busybox sandbox (shims shared by ``group``) with ``variant``'s features."""
    shim = f"defense-{tag}-{index // group}" if group > 1 else None
    fields = {"memory_mb": 64, "tmpfs_mb": 8, "shim_group": shim, "labels": {BENCH_LABEL: tag}}
    return SandboxSpec.model_validate({"image": BUSYBOX_IMAGE, **fields, **VARIANTS[variant]})


async def _create_start_series(
    raw: Containerd, n: int, tick: Callable[[], None]
) -> dict[str, list[float]]:
    tag = uuid.uuid4().hex[:8]
    times: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    for variant in VARIANTS:  # warm-up: the remapped image copy is made once, not timed
        await _timed_create(raw, f"defense-{tag}-warm-{variant}", variant_spec(tag, 0, variant))
    for i in range(n):
        for variant in VARIANTS:
            sandbox_id = f"defense-{tag}-{variant}-{i}"
            times[variant].append(
                await _timed_create(raw, sandbox_id, variant_spec(tag, i, variant))
            )
            tick()
    return times


async def _timed_create(raw: Containerd, sandbox_id: str, spec: SandboxSpec) -> float:
    try:
        started = time.perf_counter()
        await raw.create_sandbox(sandbox_id, spec)
        return (time.perf_counter() - started) * 1000
    finally:
        await raw.destroy_sandbox(sandbox_id)


async def _hold(
    raw: Containerd, n: int, variant: str, tick: Callable[[], None], concurrency: int = 4
) -> DensityFigures:
    tag = uuid.uuid4().hex[:8]
    ids: list[str] = []
    failures = 0
    limit = asyncio.Semaphore(concurrency)
    before = _memory_used_mb()

    async def make(i: int) -> None:
        nonlocal failures
        sandbox_id = uuid.uuid4().hex * 2
        async with limit:
            try:
                await raw.create_sandbox(sandbox_id, variant_spec(tag, i, variant, group=20))
                ids.append(sandbox_id)
            except Exception:
                failures += 1
            tick()

    started = time.perf_counter()
    try:
        await asyncio.gather(*(make(i) for i in range(n)))
        wall = time.perf_counter() - started
        await asyncio.sleep(SETTLE_S)  # let shims and page cache settle before reading
        used = _memory_used_mb() - before
        charged = sum(_cgroup_memory_mb(sandbox_id) for sandbox_id in ids)
    finally:
        await asyncio.shield(destroy_all(raw, ids))
    return DensityFigures(
        created=len(ids),
        failures=failures,
        wall_s=round(wall, 2),
        per_second=round(len(ids) / wall, 2) if wall else 0.0,
        memory_per_sandbox_mb=round(used / max(len(ids), 1), 2),
        cgroup_memory_per_sandbox_mb=round(charged / max(len(ids), 1), 3),
    )


def _cgroup_memory_mb(sandbox_id: str) -> float:
    usage = CGROUP_MEMORY / cgroups_path(sandbox_id).lstrip("/") / "memory.usage_in_bytes"
    try:
        return int(usage.read_text()) / (1024 * 1024)
    except (OSError, ValueError):
        return 0.0


async def run_defense(
    config: StackConfig, *, n: int, density: int, tick: Callable[[], None] = lambda: None
) -> DefenseReport:
    node = config.node_names()[0]
    async with await Containerd.connect(
        str(config.containerd_socket(node)), namespace=config.nodes.containerd_namespace
    ) as raw:
        return await measure_defense(raw, n=n, density=density, tick=tick)


async def measure_defense(
    raw: Containerd, *, n: int, density: int, tick: Callable[[], None] = lambda: None
) -> DefenseReport:
    """The measurement itself, on any containerd client (run_defense: the stack's node 1)."""
    times = await _create_start_series(raw, n, tick)
    held: dict[str, list[DensityFigures]] = {"off": [], "defaults": []}
    for variant in DENSITY_ORDER:
        held[variant].append(await _hold(raw, density, variant, tick))
    p50 = {v: round(_percentile(sorted(ms), 0.5), 1) for v, ms in times.items()}
    p90 = {v: round(_percentile(sorted(ms), 0.9), 1) for v, ms in times.items()}
    ratios = {
        f"create+start p50 {variant} / off": _ratio(p50[variant], p50["off"])
        for variant in ("userns", "quota", "defaults")
    }
    ratios["density creations per second defaults / off"] = _ratio(
        statistics.fmean(f.per_second for f in held["defaults"]),
        statistics.fmean(f.per_second for f in held["off"]),
    )
    ratios["density cgroup memory per sandbox defaults / off"] = _ratio(
        statistics.fmean(f.cgroup_memory_per_sandbox_mb for f in held["defaults"]),
        statistics.fmean(f.cgroup_memory_per_sandbox_mb for f in held["off"]),
    )
    return DefenseReport(
        n=n,
        density_n=density,
        create_start_p50_ms=p50,
        create_start_p90_ms=p90,
        density=held,
        ratios=ratios,
        targets={
            "create+start p50 defaults / off": "<= 1.1",
            "density creations per second defaults / off": ">= 0.9",
        },
    )
