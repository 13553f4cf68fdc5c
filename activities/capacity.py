"""A node's budget, what its sandboxes use of it, and when it admits one more.

Admission follows use, not ceilings. An idle sandbox takes about 1.5 MiB and
no CPU (docs/tenants.md); counting each one's nominal `cpu_cores` or
`memory_mb` made a 2-core node turn away its hundred-and-first sandbox while
the machine sat idle. So a node admits while what it measures allows:

- memory in use (MemTotal - MemAvailable) under `memory_mb`;
- host threads under `pids` (shims and sandboxes share `kernel.pid_max`);
- free disk under the state directory at least `disk_min_free_mb`;
- CPU pressure (PSI `some avg10`) under `cpu_pressure_high` - counted only
  while the sandboxes themselves use at least `SANDBOX_CPU_SHARE` of the
  node's cores (measured from their parent cgroup's CPU time), so pressure
  from anything else (the node's own burst of provisioning, runc, the control
  plane beside it) never closes the gate on the episodes it is serving;
- its sandbox count under `max_sandboxes` (a hard cap, no hysteresis).

Each measured limit has hysteresis: once a limit closes the gate it stays
closed until use falls back below the low-water mark, so a node at the edge
does not flap between admitting and refusing with every heartbeat. Nominal
`cpu_cores` still caps each sandbox's CPU while it runs (sandbox/cgroups.py);
`overcommit` only sizes the nominal CPU that tenants' quotas share
(workers/tenants.py).

`corral.provision` asks `room_for` before it makes a sandbox and raises
`NodeFull` (an `ApplicationError` type the workflow re-places on) when the
count, memory, threads or disk are used up. CPU pressure is a placement
matter only: placement reads `admitting` from heartbeats and an episode
waits while no node admits, but a provision already placed is never failed
for pressure (a scripted episode's provision cannot be retried elsewhere).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from contract.config import NodeBudgetConfig
from contract.models import NodeCapacity, NodeUsage
from sandbox.cgroups import CGROUP_ROOT
from sandbox.spec import CGROUP_PARENT

# What the host keeps for itself: the budget is this share of the machine.
HOST_SHARE = 0.9
# Host threads an idle sandbox costs (runc shim threads plus the sandbox's
# processes; fewer with shim groups): the default sandbox count follows pid_max.
THREADS_PER_IDLE_SANDBOX = 6
# Memory a new idle sandbox takes on the host (its cgroup ~1.5 MiB plus a share
# of its shim), counted for placements a heartbeat has not reported yet.
IDLE_SANDBOX_MB = 8
# CPU pressure closes the gate only while the sandboxes use this share of the
# cores; it reopens once they use less than REOPEN_SHARE (or pressure falls).
SANDBOX_CPU_SHARE = 0.75
REOPEN_SHARE = 0.5
# Sandboxes' CPU time: their common parent cgroup (sandbox/spec.py).
SANDBOX_CPUACCT = CGROUP_ROOT / "cpuacct" / CGROUP_PARENT.strip("/") / "cpuacct.usage"


def node_capacity(budget: NodeBudgetConfig | None = None) -> NodeCapacity:
    """The node's budget: the configured values, else the machine's less a host reserve."""
    budget = budget or NodeBudgetConfig()
    pids = budget.pids or int(_pid_max() * HOST_SHARE)
    return NodeCapacity(
        cores=budget.cores or float(os.cpu_count() or 1),
        memory_mb=budget.memory_mb or int(meminfo_mb("MemTotal") * HOST_SHARE),
        pids=pids,
        max_sandboxes=(
            budget.max_sandboxes
            if budget.max_sandboxes is not None
            else pids // THREADS_PER_IDLE_SANDBOX
        ),
        overcommit=budget.overcommit,
        cpu_pressure_high=budget.cpu_pressure_high,
        cpu_pressure_low=min(budget.cpu_pressure_low, budget.cpu_pressure_high),
        hysteresis=budget.hysteresis,
        disk_min_free_mb=budget.disk_min_free_mb,
    )


@dataclass
class SandboxCpuMeter:
    """Cores the sandboxes used over the last second or more, from the CPU time
    of their parent cgroup (0 where it cannot be read)."""

    usage_file: Path = SANDBOX_CPUACCT
    min_interval_s: float = 1.0
    _last: tuple[float, int] | None = None
    _cores: float = 0.0

    def cores(self) -> float:
        try:
            usage_ns = int(self.usage_file.read_text())
        except (OSError, ValueError):
            return 0.0
        now = time.monotonic()
        if self._last is None:
            self._last = (now, usage_ns)
        elif now - self._last[0] >= self.min_interval_s:
            then, before = self._last
            self._cores = max(0, usage_ns - before) / 1e9 / (now - then)
            self._last = (now, usage_ns)
        return round(self._cores, 3)


def measure(
    cpu_cores: dict[str, float],
    busy: set[str] | None = None,
    disk: Path | None = None,
    sandbox_cpu: float = 0.0,
) -> NodeUsage:
    """What the node uses now: `cpu_cores` maps its live sandboxes to their
    ceilings, `busy` names those running a step, `sandbox_cpu` is the cores
    they use (SandboxCpuMeter); memory, threads, CPU pressure and disk are the
    host's."""
    busy = busy or set()
    return NodeUsage(
        sandboxes=len(cpu_cores),
        busy=len(busy),
        cpu_cores=round(sum(cpu_cores.values()), 3),
        sandbox_cpu=sandbox_cpu,
        cpu_pressure=cpu_pressure(),
        memory_mb=meminfo_mb("MemTotal") - meminfo_mb("MemAvailable"),
        pids=_host_threads(),
        disk_free_mb=disk_free_mb(disk) if disk is not None else None,
    )


@dataclass
class AdmissionGate:
    """A node's measured limits with hysteresis: `judge` closes the gate when a
    limit is reached and opens it again only below its low-water mark."""

    capacity: NodeCapacity
    closed: dict[str, str] = field(default_factory=dict)  # limit -> why

    def judge(self, use: NodeUsage) -> NodeUsage:
        """`use` with `admitting` and `closed` filled in from this measurement."""
        for limit, (over, below, why) in self._limits(use).items():
            if limit in self.closed and below:
                del self.closed[limit]
            elif limit in self.closed or over:
                self.closed[limit] = why
        use.admitting = not self.closed
        use.closed = "; ".join(self.closed.values())
        return use

    def hard_limits(self) -> str:
        """The closed limits a provision must respect: all but CPU pressure,
        which only steers placement (see the module's docstring)."""
        return "; ".join(why for limit, why in self.closed.items() if limit != "cpu")

    def _limits(self, use: NodeUsage) -> dict[str, tuple[bool, bool, str]]:
        """Per limit: at or over it, back under its low-water mark, and the reason."""
        cap, keep = self.capacity, 1 - self.capacity.hysteresis
        cpu_bound = use.sandbox_cpu >= cap.cores * SANDBOX_CPU_SHARE
        cpu_eased = use.sandbox_cpu < cap.cores * REOPEN_SHARE
        limits = {
            "memory": (
                use.memory_mb >= cap.memory_mb,
                use.memory_mb <= cap.memory_mb * keep,
                f"memory budget of {cap.memory_mb} MiB is used up ({use.memory_mb} MiB in use)",
            ),
            "pids": (
                use.pids >= cap.pids,
                use.pids <= cap.pids * keep,
                f"pids budget of {cap.pids} is used up ({use.pids} threads)",
            ),
            "cpu": (
                cpu_bound and use.cpu_pressure >= cap.cpu_pressure_high,
                cpu_eased or use.cpu_pressure <= cap.cpu_pressure_low,
                f"CPU pressure {use.cpu_pressure:.0f}% >= {cap.cpu_pressure_high:g}% while "
                f"sandboxes use {use.sandbox_cpu:g} of {cap.cores:g} cores",
            ),
        }
        if use.disk_free_mb is not None:
            floor = cap.disk_min_free_mb
            limits["disk"] = (
                use.disk_free_mb < floor,
                use.disk_free_mb >= floor + max(64, floor * cap.hysteresis),
                f"disk has {use.disk_free_mb} MiB free, under the {floor} MiB floor",
            )
        return limits


def room_for(capacity: NodeCapacity, use: NodeUsage, closed: str = "") -> str | None:
    """Why one more sandbox does not fit, or None if it does: the count, or
    `closed` (the gate's hard limits, AdmissionGate.hard_limits)."""
    if use.sandboxes + 1 > capacity.max_sandboxes:
        return f"sandbox budget of {capacity.max_sandboxes} is used up ({use.sandboxes} live)"
    return closed or None


def free_slots(capacity: NodeCapacity, use: NodeUsage, reserved: int = 0) -> int:
    """How many more idle sandboxes the node can take now, `reserved` of them
    already promised: the count, memory and threads left, whichever is least."""
    if not use.admitting:
        return 0
    by_count = capacity.max_sandboxes - use.sandboxes
    by_memory = (capacity.memory_mb - use.memory_mb) // IDLE_SANDBOX_MB
    by_pids = (capacity.pids - use.pids) // THREADS_PER_IDLE_SANDBOX
    return max(0, min(by_count, by_memory, by_pids) - reserved)


def headroom(capacity: NodeCapacity, use: NodeUsage) -> str:
    """One line for `corral node list`: what the node can still take, or why not."""
    if not use.admitting:
        return f"closed: {use.closed}"
    memory_left = max(0, capacity.memory_mb - use.memory_mb)
    return (
        f"{free_slots(capacity, use)} more; cpu pressure {use.cpu_pressure:.0f}%, "
        f"{memory_left} MiB, {max(0, capacity.pids - use.pids)} threads left"
    )


def cpu_pressure(pressure: Path = Path("/proc/pressure/cpu")) -> float:
    """The share of the last 10 s some task waited for a CPU (PSI), in percent;
    0 on a kernel without PSI."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in pressure.read_text().splitlines():
            if line.startswith("some "):
                return float(line.split()[1].split("=")[1])
    return 0.0


def disk_free_mb(path: Path) -> int | None:
    """Free space on the filesystem holding `path` (the node's state: writable
    layers, snapshots), or None when it cannot be read."""
    with contextlib.suppress(OSError):
        return shutil.disk_usage(path).free // (1024 * 1024)
    return None


def meminfo_mb(key: str, meminfo: Path = Path("/proc/meminfo")) -> int:
    with contextlib.suppress(OSError):
        for line in meminfo.read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) // 1024
    return 0


def _pid_max() -> int:
    try:
        return int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        return 32768


def _host_threads() -> int:
    """Threads on the host: the 4th field of /proc/loadavg is running/total."""
    try:
        return int(Path("/proc/loadavg").read_text().split()[3].split("/")[1])
    except (OSError, ValueError, IndexError):
        return 0
