"""A disk quota on each sandbox's whole writable layer: btrfs subvolumes with qgroup limits.

Why btrfs: this kernel has neither ``CONFIG_QUOTA`` (ext4 ``prjquota`` fails to
mount) nor XFS quota support ("quota support not available in this kernel"),
but btrfs qgroups are btrfs's own accounting and work. containerd 1.6's
overlayfs snapshotter has no quota of its own, so:

* ``ContainerdDaemon`` keeps the snapshotter's directory
  (``<root>/io.containerd.snapshotter.v1.overlayfs``) on a btrfs filesystem in
  a sparse image file beside it (``snapshots.btrfs``), loop-mounted, quotas on
  (``ensure_quota_fs``). Image layers live there too; the file only grows by
  what is written.
* After ``Snapshots.Prepare`` the client swaps the new snapshot's directory
  (``.../snapshots/<n>``, holding the empty ``fs`` upper and ``work`` dirs) for
  a btrfs subvolume of the same name and content, and sets a qgroup limit on
  it (``limit_upper``): everything the sandbox
  writes to ``/`` (copy-ups included) is charged there; past the limit writes
  fail with EDQUOT ("Disk quota exceeded") inside that sandbox only.
* containerd's ``Remove`` deletes the directory as before (``rmdir`` of an
  empty subvolume is allowed), so teardown is unchanged.

Cost per sandbox: two ioctls (subvolume create, qgroup limit), no process, no
mount, no loop device. The ioctl numbers and structs are the kernel's UAPI
(``linux/btrfs.h``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import struct
from pathlib import Path

from contract.errors import SandboxError
from sandbox import hosttools

SNAPSHOTTER_DIR = "io.containerd.snapshotter.v1.overlayfs"
IMAGE_NAME = "snapshots.btrfs"
STAGING_DIR = "corral-quota-staging"
DEFAULT_FS_GB = 256  # sparse: the host disk only holds what is written
COMMAND_TIMEOUT_S = 120.0

_BTRFS_MAGIC = 0x94
_VOL_ARGS_SIZE = 4096  # struct btrfs_ioctl_vol_args: __s64 fd; char name[4088]
_QGROUP_LIMIT_FMT = "=QQQQQQ"  # qgroupid; btrfs_qgroup_limit: flags, max_rfer, max_excl, rsv x2
_QUOTA_CTL_FMT = "=QQ"  # cmd, status
_QGROUP_LIMIT_MAX_RFER = 1
_QUOTA_CTL_ENABLE = 1


def _ioc(direction: int, number: int, size: int) -> int:
    return (direction << 30) | (size << 16) | (_BTRFS_MAGIC << 8) | number


_IOC_WRITE, _IOC_READ = 1, 2
BTRFS_IOC_SUBVOL_CREATE = _ioc(_IOC_WRITE, 14, _VOL_ARGS_SIZE)
BTRFS_IOC_QUOTA_CTL = _ioc(_IOC_READ | _IOC_WRITE, 40, struct.calcsize(_QUOTA_CTL_FMT))
BTRFS_IOC_QGROUP_LIMIT = _ioc(_IOC_READ, 43, struct.calcsize(_QGROUP_LIMIT_FMT))


class QuotaError(SandboxError):
    """The quota filesystem or a sandbox's limit could not be set up; the message says which."""


def mount_entry(path: Path) -> tuple[str, str] | None:
    """(fstype, source) of the mount whose mount point is exactly ``path``, or None."""
    target = str(path.resolve())
    found = None
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4].replace("\\040", " ") == target:
            tail = fields[fields.index("-") + 1 :]
            found = (tail[0], tail[1])  # the last one wins: it is the one on top
    return found


def snapshotter_root(containerd_root: Path) -> Path:
    return containerd_root / SNAPSHOTTER_DIR


def has_quota_fs(containerd_root: Path) -> bool:
    """Whether the overlay snapshotter's directory is on a btrfs mount (ours)."""
    entry = mount_entry(snapshotter_root(containerd_root))
    return entry is not None and entry[0] == "btrfs"


def block_device(containerd_root: Path) -> tuple[int, int] | None:
    """(major, minor) of the loop device under the snapshotter: blkio throttles that one."""
    entry = mount_entry(snapshotter_root(containerd_root))
    if entry is None or not entry[1].startswith("/dev/"):
        return None
    try:
        rdev = os.stat(entry[1]).st_rdev
    except OSError:
        return None
    return os.major(rdev), os.minor(rdev)


def limit_upper(upper: Path, size_mb: int, owner: tuple[int, int]) -> None:
    """Put the new snapshot's directory (``upper``'s parent) on a subvolume limited to ``size_mb``.

    The whole snapshot directory, not just ``fs``: overlayfs copies up through
    ``work`` and renames into ``fs``, and a rename across subvolumes is EXDEV.
    containerd made both empty a moment ago; they are made again inside the
    subvolume with the same modes. ``owner`` is the host (uid, gid) of the
    sandbox's root: the overlay's root directory takes the upper dir's owner.
    """
    snapshot = upper.parent
    # Staged beside snapshots/, not in it: containerd's cleanup deletes unknown dirs there.
    staging = snapshot.parent.parent / STAGING_DIR
    staged = staging / snapshot.name
    try:
        modes = {child.name: stat.S_IMODE(child.stat().st_mode) for child in snapshot.iterdir()}
        staging.mkdir(mode=0o700, exist_ok=True)
        _create_subvolume(staging, staged.name)
        for name, mode in modes.items():
            (staged / name).mkdir(mode=mode)
            os.chmod(staged / name, mode)
        os.chown(staged / upper.name, *owner)
        os.chmod(staged, stat.S_IMODE(snapshot.stat().st_mode))
        _set_limit(staged, size_mb)
        for name in modes:
            (snapshot / name).rmdir()  # empty: never a recursive delete
        snapshot.rmdir()
        staged.rename(snapshot)
    except OSError as exc:
        raise QuotaError(f"disk quota on {snapshot}: {exc.strerror or exc}") from exc


def _set_limit(subvolume: Path, size_mb: int) -> None:
    fd = os.open(subvolume, os.O_RDONLY | os.O_DIRECTORY)
    try:
        limit = size_mb * 1024 * 1024
        args = struct.pack(_QGROUP_LIMIT_FMT, 0, _QGROUP_LIMIT_MAX_RFER, limit, 0, 0, 0)
        fcntl.ioctl(fd, BTRFS_IOC_QGROUP_LIMIT, bytearray(args))  # qgroupid 0: fd's subvolume
    finally:
        os.close(fd)


def _create_subvolume(parent: Path, name: str) -> None:
    args = bytearray(_VOL_ARGS_SIZE)
    encoded = name.encode()
    args[8 : 8 + len(encoded)] = encoded
    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.ioctl(fd, BTRFS_IOC_SUBVOL_CREATE, args)
    finally:
        os.close(fd)


def _enable_quota(mount_point: Path) -> None:
    fd = os.open(mount_point, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.ioctl(
            fd, BTRFS_IOC_QUOTA_CTL, bytearray(struct.pack(_QUOTA_CTL_FMT, _QUOTA_CTL_ENABLE, 0))
        )
    finally:
        os.close(fd)


async def run_tool(what: str, *argv: str, error: type[SandboxError] = QuotaError) -> str:
    """A host tool for the quota filesystem; failures are `error` naming `what`."""
    return await hosttools.run_tool(what, *argv, error=error, timeout_s=COMMAND_TIMEOUT_S)


async def ensure_quota_fs(
    containerd_root: Path, image_dir: Path, size_gb: int = DEFAULT_FS_GB
) -> bool:
    """Mount the snapshotter's btrfs (made on first use) with quotas on; idempotent.

    Returns False, touching nothing, when the snapshotter directory already
    holds snapshots on another filesystem (a state dir from before quotas):
    sandboxes there cannot get a disk quota.
    """
    target = snapshotter_root(containerd_root)
    if has_quota_fs(containerd_root):
        return True
    if target.is_dir() and any(target.iterdir()):
        return False
    image = image_dir / IMAGE_NAME
    target.mkdir(parents=True, exist_ok=True)
    if not image.exists():
        with open(image, "wb") as handle:
            handle.truncate(size_gb * 1024**3)
        await run_tool("quota filesystem: mkfs", "mkfs.btrfs", "-q", "-f", str(image))
    # A stack restarted while sandboxes still use the old (lazily unmounted) mount:
    # reuse its loop device, since a second one on the same file would be a second,
    # diverging btrfs on the same bytes.
    attached = (
        await run_tool(
            "quota filesystem: find loop device", "losetup", "-n", "-O", "NAME", "-j", str(image)
        )
    ).split()
    source = attached[0] if attached else str(image)
    options = "noatime" if attached else "loop,noatime"
    await run_tool(
        "quota filesystem: mount", "mount", "-t", "btrfs", "-o", options, source, str(target)
    )
    try:
        _enable_quota(target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            await run_tool("quota filesystem: unmount", "umount", "-l", str(target))
        raise QuotaError(f"quota filesystem: enable qgroups on {target}: {exc.strerror}") from exc
    return True
