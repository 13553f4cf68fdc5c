"""Elastic CPU: a sandbox's cgroup CPU weight follows its steps.

Most agent sandboxes sit idle, waiting for the model's next action. An
elastic sandbox is created at the minimal weight (cgroup v1 ``cpu.shares``
2) and raised to full weight (1024 per core of its ceiling) only while a
step runs in it, so a node can hold many more sandboxes than it has cores
and the working ones get the CPU. The CFS quota (``cpu_cores``) stays the
busy ceiling. A sandbox labelled ``corral.cpu=reserved`` (a hard quota its
user asked for) keeps its full weight always.

The cgroup is ``/sys/fs/cgroup/cpu/corral/<sandbox id>`` (cgroupfs v1, the
layout of ``sandbox.spec.cgroups_path``); ``cpu`` is ``cpu,cpuacct`` on hosts
that co-mount them, which keep ``cpu`` as a symlink. A write costs a few
microseconds, so raising the weight adds nothing visible to a step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from contract.labels import CPU_MODE_LABEL
from sandbox.spec import CGROUP_PARENT

CGROUP_ROOT = Path("/sys/fs/cgroup")
IDLE_SHARES = 2  # the kernel's minimum
SHARES_PER_CORE = 1024  # the kernel's default weight of one task group
MAX_SHARES = 262_144


def busy_shares(cpu_cores: float) -> int:
    """The full weight of a sandbox whose ceiling is ``cpu_cores``."""
    return max(IDLE_SHARES, min(MAX_SHARES, round(SHARES_PER_CORE * cpu_cores)))


def cgroup_dir(sandbox_id: str, controller: str = "cpu", root: Path = CGROUP_ROOT) -> Path:
    return root / controller / CGROUP_PARENT.strip("/") / sandbox_id


def read_shares(sandbox_id: str, root: Path = CGROUP_ROOT) -> int:
    return int((cgroup_dir(sandbox_id, root=root) / "cpu.shares").read_text())


def ceiling_cores(sandbox_id: str, root: Path = CGROUP_ROOT) -> float | None:
    """The sandbox's CFS quota in cores; None without a quota or a cgroup."""
    folder = cgroup_dir(sandbox_id, root=root)
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def set_shares(sandbox_id: str, shares: int, root: Path = CGROUP_ROOT) -> bool:
    """Write the weight; False when the cgroup is gone (the sandbox was torn down)."""
    try:
        (cgroup_dir(sandbox_id, root=root) / "cpu.shares").write_text(str(shares))
    except FileNotFoundError:
        return False
    return True


class ElasticCpu:
    """Counts the steps running in each sandbox of this process: the weight is
    full while at least one runs (an interactive exec may overlap a file read)
    and drops to the minimum when the last one ends."""

    def __init__(self, root: Path = CGROUP_ROOT) -> None:
        self._root = root
        self._running: dict[str, int] = {}

    def running(self, sandbox_id: str) -> int:
        return self._running.get(sandbox_id, 0)

    def busy_sandboxes(self) -> int:
        return len(self._running)

    def busy_ids(self) -> set[str]:
        """The sandboxes running a step now (admission counts their ceilings)."""
        return set(self._running)

    @contextlib.contextmanager
    def busy(self, sandbox_id: str, labels: dict[str, str]) -> Iterator[None]:
        """Full weight for the body; a no-op for a sandbox whose weight is reserved."""
        if labels.get(CPU_MODE_LABEL) == "reserved":
            yield
            return
        if self._running.get(sandbox_id, 0) == 0:
            cores = ceiling_cores(sandbox_id, self._root) or 1.0
            set_shares(sandbox_id, busy_shares(cores), self._root)
        self._running[sandbox_id] = self._running.get(sandbox_id, 0) + 1
        try:
            yield
        finally:
            left = self._running.pop(sandbox_id) - 1
            if left:
                self._running[sandbox_id] = left
            else:
                set_shares(sandbox_id, IDLE_SHARES, self._root)


def is_frozen(sandbox_id: str, root: Path = CGROUP_ROOT) -> bool | None:
    """Whether the sandbox's freezer holds it (frozen or freezing): what containerd
    reports as paused or pausing, read without a round trip. None when its cgroup
    is not where Corral puts it (ask containerd then)."""
    v1 = cgroup_dir(sandbox_id, "freezer", root) / "freezer.state"
    v2 = root / CGROUP_PARENT.strip("/") / sandbox_id / "cgroup.freeze"
    for path, thawed in ((v1, "THAWED"), (v2, "0")):
        with contextlib.suppress(OSError):
            return path.read_text().strip() != thawed
    return None


def thaw_directly(sandbox_id: str, root: Path = CGROUP_ROOT) -> bool:
    """Thaw a frozen sandbox through the cgroup filesystem, around its shim.

    A sandbox frozen while ``runc exec`` was starting a process in it holds
    that process (already in the sandbox's cgroups) frozen, and ``runc exec``
    waits for it forever; the shim then answers nothing more for the sandbox.
    Writing the freezer directly lets ``runc exec`` finish, so the kill and
    delete that follow can run. Returns whether it was frozen. cgroup v1
    (``freezer.state``) or v2 (``cgroup.freeze``).
    """
    v1 = cgroup_dir(sandbox_id, "freezer", root) / "freezer.state"
    v2 = root / CGROUP_PARENT.strip("/") / sandbox_id / "cgroup.freeze"
    with contextlib.suppress(OSError):
        if v1.exists() and v1.read_text().strip() != "THAWED":
            v1.write_text("THAWED")
            return True
        if v2.exists() and v2.read_text().strip() == "1":
            v2.write_text("0")
            return True
    return False
