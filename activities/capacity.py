"""A node's budget and what its sandboxes have taken of it.

CPU is nominal and overcommitted: an elastic sandbox's `cpu_cores` is its
ceiling while a step runs, not a reservation (sandbox/cgroups.py), so the
specs a node holds may add up to `overcommit` x its cores. Memory and pids
are physical and shared by everything on the host, so they are measured,
not summed from specs: the node refuses a sandbox while the host's memory in
use or its thread count is at the budget. The sandbox count is this node's.

`corral.provision` asks `room_for` before it makes a sandbox and raises
`NodeFull` (an `ApplicationError` type the workflow re-places on) when the
answer names an exhausted budget.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from activities.models import NodeCapacity, NodeUsage

# What the host keeps for itself: the budget is this share of the machine.
HOST_SHARE = 0.9
# Host threads an idle sandbox costs (runc shim threads plus the sandbox's
# processes; fewer with shim groups): the default sandbox count follows pid_max.
THREADS_PER_IDLE_SANDBOX = 6
DEFAULT_OVERCOMMIT = 50.0


class NodeBudgetConfig(BaseModel):
    """`nodes.budget` in temporal-dev.yaml; every unset value comes from the machine."""

    model_config = ConfigDict(extra="forbid")
    cores: float | None = Field(default=None, gt=0)
    memory_mb: int | None = Field(default=None, ge=64)
    pids: int | None = Field(default=None, ge=64)
    max_sandboxes: int | None = Field(default=None, ge=0)
    overcommit: float = Field(default=DEFAULT_OVERCOMMIT, ge=1)


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
    )


def committed(cpu_cores: dict[str, float], busy: int = 0) -> NodeUsage:
    """Use of the budget: `cpu_cores` maps this node's live sandboxes to their
    ceilings; memory and threads are the host's."""
    return NodeUsage(
        sandboxes=len(cpu_cores),
        busy=busy,
        cpu_cores=round(sum(cpu_cores.values()), 3),
        memory_mb=meminfo_mb("MemTotal") - meminfo_mb("MemAvailable"),
        pids=_host_threads(),
    )


def room_for(capacity: NodeCapacity, use: NodeUsage, cpu_cores: float) -> str | None:
    """Why one more sandbox with ceiling `cpu_cores` does not fit, or None if it does."""
    cpu_budget = capacity.cores * capacity.overcommit
    if use.sandboxes + 1 > capacity.max_sandboxes:
        return f"sandbox budget of {capacity.max_sandboxes} is used up ({use.sandboxes} live)"
    if use.cpu_cores + cpu_cores > cpu_budget:
        return (
            f"cpu budget of {cpu_budget:g} cores ({capacity.cores:g} x {capacity.overcommit:g}) "
            f"is used up ({use.cpu_cores:g} committed, {cpu_cores:g} asked)"
        )
    if use.memory_mb >= capacity.memory_mb:
        return f"memory budget of {capacity.memory_mb} MiB is used up ({use.memory_mb} MiB in use)"
    if use.pids >= capacity.pids:
        return f"pids budget of {capacity.pids} is used up ({use.pids} threads)"
    return None


def meminfo_mb(field: str, meminfo: Path = Path("/proc/meminfo")) -> int:
    with contextlib.suppress(OSError):
        for line in meminfo.read_text().splitlines():
            if line.startswith(f"{field}:"):
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
