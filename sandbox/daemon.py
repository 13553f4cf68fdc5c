"""A private containerd daemon: config, socket, state and logs under one directory.

PID 1 on these machines is not systemd, so every stack (``corral up``) and every
integration test session starts its own containerd with this class and stops it
by pid. Nothing is shared with a system containerd: root, state, the gRPC and
ttrpc sockets all live under ``root_dir``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import grpc

from contract.errors import ContainerdUnavailable
from sandbox import shimns

_log = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 20.0
STOP_GRACE_S = 5.0
SHIM_BINARY = "containerd-shim"
# Parent of the daemons' state dirs: root-owned and searchable (see state_dir).
STATE_BASE = Path("/run/corral-containerd")  # prefix: containerd-shim-runc-v2, -runsc-v1 ...


class ContainerdDaemon:
    """Start, probe and stop one containerd child process."""

    def __init__(self, root_dir: Path, *, binary: str = "containerd") -> None:
        self.root_dir = Path(root_dir).resolve()
        self.binary = binary
        self._proc: subprocess.Popen[bytes] | None = None

    # -- paths -------------------------------------------------------------
    @property
    def socket(self) -> str:
        return str(self.root_dir / "containerd.sock")

    @property
    def config_path(self) -> Path:
        return self.root_dir / "config.toml"

    @property
    def log_path(self) -> Path:
        return self.root_dir / "containerd.log"

    @property
    def pid_path(self) -> Path:
        return self.root_dir / "containerd.pid"

    @property
    def state_dir(self) -> Path:
        """containerd's state (task bundles, rootfs mounts); ``root_dir/state`` links to it.

        Outside ``root_dir`` because runc mounts a user-namespaced sandbox's
        rootfs as the mapped root, an unprivileged host uid, which must be able
        to search every directory above the bundle: a 0700 parent such as
        pytest's ``/tmp/pytest-of-root`` (reset to 0700 by every pytest session)
        fails it. A ``root_dir/state`` that is a real directory (made before)
        stays in use.
        """
        in_root = self.root_dir / "state"
        if in_root.is_dir() and not in_root.is_symlink():
            return in_root
        return STATE_BASE / hashlib.sha256(str(self.root_dir).encode()).hexdigest()[:16]

    @property
    def pid(self) -> int | None:
        if self._proc is not None:
            return self._proc.pid
        return _read_pid(self.pid_path)

    def render_config(self) -> str:
        """containerd 1.6 config (version 2): everything under root_dir, no CRI."""
        root = self.root_dir
        return "\n".join(
            [
                "version = 2",
                f'root = "{root / "root"}"',
                f'state = "{self.state_dir}"',
                'disabled_plugins = ["io.containerd.grpc.v1.cri"]',
                "[grpc]",
                f'  address = "{self.socket}"',
                "[ttrpc]",
                f'  address = "{self.socket}.ttrpc"',
                "[debug]",
                '  level = "info"',
                "",
            ]
        )

    # -- lifecycle ---------------------------------------------------------
    async def start(self) -> None:
        """Start containerd and wait until its Version RPC answers."""
        if self.is_running() and await _answers(self.socket, timeout_s=2.0):
            return
        self.root_dir.mkdir(parents=True, exist_ok=True)
        await self._reap_previous_instance()
        self._remove_stale_sockets()
        self._link_state_dir()
        await self._mount_quota_fs()
        shimns.prepare(self.root_dir)
        self.config_path.write_text(self.render_config())
        log = self.log_path.open("ab")
        try:
            self._proc = subprocess.Popen(
                [self.binary, "--config", str(self.config_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=shimns.daemon_env(),  # finds the shim wrapper (sandbox/shimns.py)
                start_new_session=True,  # its own session: our Ctrl-C does not reach it
            )
        finally:
            log.close()
        self.pid_path.write_text(f"{self._proc.pid}\n")
        await self._wait_until_ready()

    def _link_state_dir(self) -> None:
        state, link = self.state_dir, self.root_dir / "state"
        if state == link:
            return
        STATE_BASE.mkdir(mode=0o711, exist_ok=True)
        state.mkdir(mode=0o711, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(state)

    async def _mount_quota_fs(self) -> None:
        """The snapshotter's btrfs with qgroups (sandbox.quota): per-sandbox disk quotas.

        Without it (no btrfs tools, an old state dir) containerd still starts;
        sandboxes that ask for ``disk_mb`` are then refused with the reason.
        """
        from sandbox import quota, userns

        for directory in userns.allow_traverse(self.root_dir):
            _log.info("made %s searchable for user-namespaced sandboxes", directory)
        try:
            mounted = await quota.ensure_quota_fs(self.root_dir / "root", self.root_dir)
        except quota.QuotaError as exc:
            _log.warning("containerd at %s runs without disk quotas: %s", self.root_dir, exc)
            return
        if not mounted:
            _log.warning(
                "containerd at %s runs without disk quotas: its snapshotter dir predates them",
                self.root_dir,
            )

    async def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise ContainerdUnavailable(
                    f"containerd exited with {self._proc.returncode} at start; see {self.log_path}"
                )
            if await _answers(self.socket, timeout_s=1.0):
                return
            await asyncio.sleep(0.05)
        raise ContainerdUnavailable(
            f"containerd did not answer on {self.socket} within {STARTUP_TIMEOUT_S:.0f}s"
        )

    def is_running(self) -> bool:
        pid = self.pid
        if pid is None:
            return False
        if self._proc is not None and self._proc.pid == pid:
            return self._proc.poll() is None
        return _is_our_containerd(pid, self.config_path)

    async def stop(self, *, kill_shims: bool = False) -> None:
        """SIGTERM, then SIGKILL after a grace period; unmount what is left under root_dir.

        Shims (and so sandboxes) survive a containerd stop by design; pass
        ``kill_shims=True`` to also kill the shims that serve this daemon.
        """
        pid = self.pid
        if pid is not None and self.is_running():
            await _terminate(pid, self._proc)
        self._proc = None
        with contextlib.suppress(FileNotFoundError):
            self.pid_path.unlink()
        if kill_shims:
            for shim_pid in self.shim_pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(shim_pid, signal.SIGKILL)
            self._kill_orphaned_containers()
        unmount_under(self.root_dir)
        state = self.state_dir
        if state.is_relative_to(STATE_BASE):
            unmount_under(state)
            if kill_shims:  # nothing runs from it any more
                shutil.rmtree(state, ignore_errors=True)

    @property
    def runc_root(self) -> Path:
        """Where this daemon's sandboxes keep runc state (the client's default too)."""
        return self.root_dir / "runc"

    def _kill_orphaned_containers(self) -> None:
        """A killed shim leaves its container running: kill each init pid runc recorded."""
        for state in self.runc_root.glob("*/*/state.json"):
            with contextlib.suppress(OSError, ValueError, KeyError, ProcessLookupError):
                os.kill(int(json.loads(state.read_text())["init_process_pid"]), signal.SIGKILL)

    def shim_pids(self) -> list[int]:
        """Pids of the shims started by this daemon (they name its socket in argv)."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            is_shim = bool(argv) and Path(argv[0].decode(errors="replace")).name.startswith(
                SHIM_BINARY
            )
            if is_shim and self.socket.encode() in argv:
                found.append(int(entry.name))
        return found

    async def _reap_previous_instance(self) -> None:
        """A crashed stack may have left its containerd running; stop it (it is ours)."""
        pid = _read_pid(self.pid_path)
        if pid is not None and _is_our_containerd(pid, self.config_path):
            await _terminate(pid, None)

    def _remove_stale_sockets(self) -> None:
        for path in (Path(self.socket), Path(self.socket + ".ttrpc")):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    async def __aenter__(self) -> ContainerdDaemon:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def _answers(socket: str, timeout_s: float) -> bool:
    """Whether a containerd answers the Version RPC on ``socket``."""
    if not os.path.exists(socket):
        return False
    from google.protobuf import empty_pb2

    from sandbox._gen.containerd.api.services.version.v1 import version_pb2_grpc

    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        try:
            await version_pb2_grpc.VersionStub(channel).Version(
                empty_pb2.Empty(), timeout=timeout_s
            )
        except grpc.aio.AioRpcError:
            return False
    return True


async def _terminate(pid: int, proc: subprocess.Popen[bytes] | None) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline and _alive(pid, proc):
        await asyncio.sleep(0.05)
    if _alive(pid, proc):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        while _alive(pid, proc):
            await asyncio.sleep(0.02)


def _alive(pid: int, proc: subprocess.Popen[bytes] | None) -> bool:
    if proc is not None:
        return proc.poll() is None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie child of someone else still answers kill(0); look at its state
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _is_our_containerd(pid: int, config_path: Path) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return str(config_path).encode() in argv and _alive(pid, None)


def unmount_under(root: Path) -> list[str]:
    """Lazily unmount every mount point under ``root``, deepest first; return them."""
    root_str = str(Path(root).resolve())
    targets = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mount_point = line.split()[4].replace("\\040", " ")
        if mount_point == root_str or mount_point.startswith(root_str + "/"):
            targets.append(mount_point)
    for target in sorted(targets, key=len, reverse=True):
        # umount2(MNT_DETACH) via the umount binary would be shelling out for a
        # syscall; libc's umount2 is one ctypes call away.
        _umount_detach(target)
    return targets


def _umount_detach(target: str) -> None:
    import ctypes
    import ctypes.util

    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    mnt_detach = 2
    libc.umount2(target.encode(), mnt_detach)
