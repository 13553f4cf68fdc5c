"""User namespaces: root in a sandbox is an unprivileged uid range on the host.

What works here (runc 1.1.5, crun 1.8.1, containerd 1.6.20, kernel 6.18):
runc 1.1 takes ``uidMappings``/``gidMappings`` but has no idmapped rootfs
(that came in runc 1.2), and containerd 1.6's overlay snapshotter cannot remap
either, so the rootfs must be *owned* by the mapped ids. As containerd's own
``ctr run --remap-labels`` does, each image gets a chowned copy once per uid
range: a snapshot prepared on the image's chain, every entry shifted by the
range's first host id, committed as ``<chain id>@userns-<host id>-<size>``
(``Containerd._remapped_parent``) and referenced from the image's config blob
(a ``containerd.io/gc.ref.snapshot`` label), so it lives as long as the
image. Every sandbox of that range then prepares its writable layer on that
commit, exactly as before on the image: no per-sandbox cost.
The chowned copy costs one copy-up of the image (about the image's size on
disk) per range, which is why ranges are per tenant, not per sandbox.

Ranges come from a pool (``UidPool``): ``ranges`` blocks of ``size`` ids
from ``start`` (default 1,000,000,000: above Debian's login uids (< 60,000)
and its subordinate-id allocations (100,000 to 600,100,000)). A sandbox's
``SandboxSpec.userns_range`` picks its block; ``range_for_tenant`` gives each
tenant a stable one.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import stat
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract.errors import InvalidSpec, SandboxError
from sandbox.quota import run_tool

DEFAULT_START = 1_000_000_000
DEFAULT_SIZE = 65536
DEFAULT_RANGES = 1024
DEFAULT_TENANT = "default"


class UsernsError(SandboxError):
    """The remapped copy of an image could not be made; the message names the step."""


@dataclass(frozen=True)
class IdMapping:
    """Sandbox ids 0..size-1 are host ids host_id..host_id+size-1 (uids and gids alike)."""

    host_id: int
    size: int

    def oci(self) -> list[dict[str, int]]:
        return [{"containerID": 0, "hostID": self.host_id, "size": self.size}]

    def to_host(self, sandbox_id: int) -> int:
        return self.host_id + sandbox_id

    def to_sandbox(self, host_id: int) -> int | None:
        inside = host_id - self.host_id
        return inside if 0 <= inside < self.size else None

    @property
    def snapshot_suffix(self) -> str:
        return f"@userns-{self.host_id}-{self.size}"


SCRATCH_MOUNT_PREFIX = "remap-"  # where a remap mounts its scratch snapshot to shift it
SCRATCH_SUFFIX = "-prepare"  # the active snapshot a remap shifts before committing it


def scratch_key(remapped_key: str) -> str:
    """The key a remap prepares ``remapped_key`` under until it commits."""
    return remapped_key + SCRATCH_SUFFIX


def is_remapped_key(key: str) -> bool:
    """An image chain's copy shifted into a range (``IdMapping.snapshot_suffix``)."""
    return "@userns-" in key


def is_scratch_key(key: str) -> bool:
    """A remap's scratch snapshot: a node killed mid-remap leaves one behind."""
    return is_remapped_key(key) and key.endswith(SCRATCH_SUFFIX)


@dataclass(frozen=True)
class UidPool:
    """The node's host id ranges for sandboxes (``temporal-dev.yaml`` ``sandbox.userns``)."""

    start: int = DEFAULT_START
    size: int = DEFAULT_SIZE
    ranges: int = DEFAULT_RANGES

    def __post_init__(self) -> None:
        if self.start < 65536 or self.size < 65536 or self.ranges < 1:
            raise ValueError(
                f"uid pool start {self.start}, size {self.size}, ranges "
                f"{self.ranges}: want start >= 65536, size >= 65536, ranges >= 1"
            )
        if self.start + self.size * self.ranges > 2**32 - 1:
            raise ValueError(
                f"uid pool start {self.start} + {self.ranges} x {self.size} ids passes 2^32-1"
            )

    def mapping(self, index: int) -> IdMapping:
        if not 0 <= index < self.ranges:
            raise InvalidSpec(
                f"userns_range {index} is outside the node's pool (0..{self.ranges - 1})"
            )
        return IdMapping(self.start + index * self.size, self.size)


def range_for_tenant(tenant: str, ranges: int = DEFAULT_RANGES) -> int:
    """A stable range index for ``tenant``: its sandboxes share one remapped image copy.

    The "default" tenant gets range 0, the warm pool's (``activities.pool``
    serves only specs of its template's shape, range included); every other
    tenant one of the rest, by hash.
    """
    if tenant == DEFAULT_TENANT or ranges == 1:
        return 0
    digest = int.from_bytes(hashlib.sha256(tenant.encode()).digest()[:8], "big")
    return 1 + digest % (ranges - 1)


def check_opt_out(user_namespace: bool, tenant: str, tenant_allows: bool) -> None:
    """The admission gate for ``user_namespace: false``: only tenants allowed to."""
    if not user_namespace and not tenant_allows:
        raise InvalidSpec(
            f"user_namespace: false is not allowed for tenant {tenant!r} "
            "(its config needs allow_host_root: true)"
        )


def host_owner(mapping: IdMapping | None, user: tuple[int, int]) -> tuple[int, int]:
    """Host (uid, gid) of a sandbox (uid, gid): what volumes and upper dirs are chowned to."""
    if mapping is None:
        return user
    return mapping.to_host(user[0]), mapping.to_host(user[1])


def shift_tree(root: Path, mapping: IdMapping) -> int:
    """lchown every entry under ``root`` (itself included) by the mapping; keep modes.

    chown clears setuid/setgid bits, so each non-link's mode is restored: a
    setuid binary of the image stays setuid for the sandbox's own root.
    Returns the number of entries shifted.
    """
    count = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [".", *dirnames, *filenames]:
            path = os.path.join(dirpath, name)
            info = os.lstat(path)
            if name != "." and stat.S_ISDIR(info.st_mode) and not os.path.islink(path):
                continue  # directories are shifted as "." of their own walk step
            uid = mapping.to_host(info.st_uid) if info.st_uid < mapping.size else info.st_uid
            gid = mapping.to_host(info.st_gid) if info.st_gid < mapping.size else info.st_gid
            os.lchown(path, uid, gid)
            if not stat.S_ISLNK(info.st_mode):
                os.chmod(path, stat.S_IMODE(info.st_mode))
            count += 1
    return count


def mount_argv(mounts: Sequence[Any], target: Path) -> list[str]:
    """``mount`` argv for the one mount a snapshot Prepare returns (overlay or bind)."""
    if len(mounts) != 1:
        raise UsernsError(f"remap image: expected one snapshot mount, got {len(mounts)}")
    mount = mounts[0]
    options = ",".join(mount.options)
    return ["mount", "-t", mount.type, "-o", options, mount.source, str(target)]


async def shift_mounted(mounts: Sequence[Any], mapping: IdMapping, scratch: Path) -> int:
    """Mount a prepared snapshot under ``scratch``, shift its tree, unmount."""
    scratch.mkdir(parents=True, exist_ok=True)
    target = Path(tempfile.mkdtemp(prefix=SCRATCH_MOUNT_PREFIX, dir=scratch))
    try:
        await run_tool("remap image: mount", *mount_argv(mounts, target), error=UsernsError)
        try:
            return await asyncio.to_thread(shift_tree, target, mapping)
        finally:
            await run_tool("remap image: unmount", "umount", str(target), error=UsernsError)
    finally:
        with contextlib.suppress(OSError):
            target.rmdir()


async def clear_stale_mounts(scratch: Path, older_than_s: float) -> None:
    """Unmount and remove the mount points of remaps killed mid-shift."""
    now = time.time()
    for target in sorted(scratch.glob(SCRATCH_MOUNT_PREFIX + "*")):
        with contextlib.suppress(OSError):
            if now - target.stat().st_mtime < older_than_s:
                continue
            with contextlib.suppress(UsernsError):  # not mounted: killed before or after
                await run_tool("remap: unmount stale", "umount", str(target), error=UsernsError)
            target.rmdir()


def allow_traverse(path: Path) -> list[Path]:
    """Give ``path`` and its ancestors the search bit for others; return those changed.

    runc sets up a user-namespaced sandbox's mounts (its rootfs, /workspace)
    as the mapped root, an unprivileged host uid, so every directory above a
    state dir must be searchable: a 0700 parent (pytest's
    ``/tmp/pytest-of-root``, ``/root``) fails the rootfs mount. Search
    (``o+x``) lets a path be walked, not listed.
    """
    changed = []
    for directory in [path, *path.parents]:
        mode = directory.stat().st_mode
        if not mode & stat.S_IXOTH:
            os.chmod(directory, stat.S_IMODE(mode) | stat.S_IXOTH)
            changed.append(directory)
    return changed


OVERFLOW_ID = 65534  # what a user namespace shows for an unmapped id


def read_mappings(pid: int) -> tuple[IdMapping, IdMapping] | None:
    """The (uid, gid) mappings of ``pid``'s user namespace (identity outside one); None if gone.

    A sandbox maps one range from 0 (``IdMapping.oci``): the first line says it all.
    """
    found = []
    for name in ("uid_map", "gid_map"):
        try:
            first = Path(f"/proc/{pid}/{name}").read_text().split()
        except OSError:
            return None
        inside, outside, count = (int(x) for x in first[:3])
        found.append(IdMapping(outside - inside, count))
    return found[0], found[1]


def id_inside(mapping: IdMapping, host_id: int) -> int:
    """``host_id`` as seen inside the namespace of ``mapping``."""
    inside = mapping.to_sandbox(host_id)
    return OVERFLOW_ID if inside is None else inside
