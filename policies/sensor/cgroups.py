"""cgroup v1 ``/corral/<id>`` directories -> sandbox container ids and metadata."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from policies.falco.event import ContainerInfo

CGROUP_ROOT = Path("/sys/fs/cgroup")
DEFAULT_CONTROLLER = "pids"  # every runc sandbox has one; never used by the host here
SANDBOX_PARENT = "corral"

# Full container id -> its metadata (labels from containerd), or None if unknown.
ContainerResolver = Callable[[str], ContainerInfo | None]


def subsys_index(controller: str, proc_cgroups: Path = Path("/proc/cgroups")) -> int:
    """Index of ``controller`` in ``task->cgroups->subsys[]``.

    /proc/cgroups lists every compiled-in controller in subsystem-id order.
    """
    lines = [ln for ln in proc_cgroups.read_text().splitlines() if not ln.startswith("#")]
    names = [ln.split()[0] for ln in lines if ln.strip()]
    return names.index(controller)


def parent_dir(controller: str = DEFAULT_CONTROLLER, root: Path = CGROUP_ROOT) -> Path:
    return root / controller / SANDBOX_PARENT


def ensure_parent(controller: str = DEFAULT_CONTROLLER, root: Path = CGROUP_ROOT) -> int:
    """Create ``/corral`` if needed (runc would on the first sandbox); return its id."""
    path = parent_dir(controller, root)
    path.mkdir(exist_ok=True)
    return path.stat().st_ino


class DictResolver:
    """A ``ContainerResolver`` over a dict (tests, or a label snapshot)."""

    def __init__(self, containers: dict[str, ContainerInfo] | None = None) -> None:
        self.containers = containers or {}

    def __call__(self, full_id: str) -> ContainerInfo | None:
        return self.containers.get(full_id)


class CgroupMap:
    """Leaf cgroup kernfs id -> ContainerInfo (cached; misses rescan, rate-limited)."""

    def __init__(
        self,
        resolver: ContainerResolver | None = None,
        controller: str = DEFAULT_CONTROLLER,
        root: Path = CGROUP_ROOT,
        rescan_interval_s: float = 0.05,
    ) -> None:
        self.resolver = resolver or DictResolver()
        self.parent = parent_dir(controller, root)
        self.controller = controller
        self._by_cgid: dict[int, str] = {}
        self._info: dict[str, ContainerInfo] = {}
        self._unknown: dict[int, float] = {}
        self._interval = rescan_interval_s

    def container(self, cgid: int, pid: int) -> ContainerInfo | None:
        full_id = self._by_cgid.get(cgid)
        if full_id is None:
            full_id = self._lookup(cgid, pid)
            if full_id is None:
                return None
        info = self._info.get(full_id)
        if info is None:
            info = self.resolver(full_id) or ContainerInfo(full_id=full_id)
            self._info[full_id] = info
        return info

    def forget(self, full_id: str) -> None:
        """Drop a removed sandbox (its cgroup id may be reused)."""
        self._info.pop(full_id, None)
        for cgid in [k for k, v in self._by_cgid.items() if v == full_id]:
            del self._by_cgid[cgid]

    def _lookup(self, cgid: int, pid: int) -> str | None:
        # A new id scans at once (a sandbox just started); an id that stays
        # unknown rescans at most every interval.
        now = time.monotonic()
        last = self._unknown.get(cgid)
        if last is None or now - last >= self._interval:
            self._unknown[cgid] = now
            if len(self._unknown) > 4096:
                self._unknown.clear()
            self._scan()
            if cgid in self._by_cgid:
                return self._by_cgid[cgid]
        full_id = self._from_proc(pid)
        if full_id is not None:
            self._by_cgid[cgid] = full_id
            self._unknown.pop(cgid, None)
        return full_id

    def _scan(self) -> None:
        try:
            entries = list(os.scandir(self.parent))
        except OSError:
            return
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                try:
                    self._by_cgid[entry.inode()] = entry.name
                except OSError:
                    continue

    def _from_proc(self, pid: int) -> str | None:
        """Leaf name under /corral/ in /proc/<pid>/cgroup (the process may be gone)."""
        try:
            text = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            return None
        return container_id_from_cgroup(text, self.controller)


def container_id_from_cgroup(text: str, controller: str = DEFAULT_CONTROLLER) -> str | None:
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or controller not in parts[1].split(","):
            continue
        segs = [s for s in parts[2].split("/") if s]
        if SANDBOX_PARENT in segs:
            i = segs.index(SANDBOX_PARENT)
            if i + 1 < len(segs):
                return segs[i + 1]
    return None
