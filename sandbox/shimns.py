"""Shims in mount namespaces of their own: creation that does not slow with density.

Measured (bench --density, perf on a quiet node): runc reads the whole mount
table (/proc/self/mountinfo) several times on every create, start, exec and
delete, and the kernel's cost of printing it grows with every mount in it.
With every sandbox's rootfs overlay mounted in the host namespace, that was a
third of the node's CPU at 1,000 live sandboxes, and creation fell from 16 to
5 per second between 0 and 1,500 live.

So the node's containerd starts its shims through a wrapper
(`shim/containerd-shim-runc-corral`, runtime name `io.containerd.runc.corral`)
that gives each shim a mount namespace of its own: a shim mounts the rootfs of
its own sandboxes (a shim group, up to `nodes.shim_group_size`) there, and
runc, containerd and the host see a table of a few dozen entries.

Two host directories hold mounts a sandbox needs after its shim started: the
workspace volumes and the user-namespace remap scratch. They are made shared
mount points here, and the wrapper's namespaces are their slaves, so a volume
mounted (or unmounted) on the host reaches every shim. Anything else mounted on
the host after a shim started stays invisible to it.

The runtime name keeps the `io.containerd.runc` prefix because containerd
reads runc's options (checkpoint and restore paths) only for runtimes named so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import shutil
from pathlib import Path

from sandbox.quota import mount_entry

RUNTIME_NAME = "io.containerd.runc.corral"
PLAIN_RUNTIME_NAME = "io.containerd.runc.v2"
SHIM_DIR = Path(__file__).resolve().parent / "shim"
MARKER = "shim-runtime"  # under the daemon's root dir: the runtime its sandboxes use
SHARED_DIRS = ("workspaces", "remap")  # under the daemon's root dir

MS_BIND = 4096
MS_SHARED = 1 << 20

log = logging.getLogger("corral.shimns")


def prepare(root_dir: Path) -> str:
    """Before containerd starts: share the directories sandboxes mount from and
    record the runtime name clients must use. Falls back to the plain runc shim
    (recorded as such) where the host cannot do it."""
    marker = root_dir / MARKER
    why_not = _missing_tools()
    if why_not is None:
        try:
            for name in SHARED_DIRS:
                make_shared(root_dir / name)
        except OSError as err:
            why_not = f"cannot make a shared mount: {err}"
    name = RUNTIME_NAME if why_not is None else PLAIN_RUNTIME_NAME
    if why_not is not None:
        log.warning("shims share the host mount namespace: %s", why_not)
    marker.write_text(name + "\n")
    return name


def runtime_name(root_dir: Path) -> str:
    """The runtime the daemon under `root_dir` was prepared for (plain runc if unknown)."""
    try:
        name = (root_dir / MARKER).read_text().strip()
    except OSError:
        return PLAIN_RUNTIME_NAME
    return name if name in (RUNTIME_NAME, PLAIN_RUNTIME_NAME) else PLAIN_RUNTIME_NAME


def daemon_env() -> dict[str, str]:
    """containerd's environment: the wrapper's directory first on PATH, where
    containerd looks for `containerd-shim-runc-corral`."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(SHIM_DIR), env.get("PATH", os.defpath)])
    return env


def make_shared(path: Path) -> None:
    """Make `path` a shared mount point (a bind mount onto itself first); idempotent."""
    path.mkdir(parents=True, exist_ok=True)
    target = str(path.resolve()).encode()
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if mount_entry(path) is None and libc.mount(target, target, None, MS_BIND, None) != 0:
        raise OSError(ctypes.get_errno(), f"bind mount of {path} onto itself failed")
    if libc.mount(None, target, None, MS_SHARED, None) != 0:
        raise OSError(ctypes.get_errno(), f"making {path} a shared mount failed")


def _missing_tools() -> str | None:
    for tool in ("unshare", "containerd-shim-runc-v2"):
        if shutil.which(tool) is None:
            return f"{tool} not found"
    return None
