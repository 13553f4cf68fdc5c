"""docker and podman as benchmark peers, brought by the bench itself.

A fresh machine of this kind has Debian's `docker.io` and `podman` (installed
by scripts/setup.sh) but no running daemon and no image: no registry is
reachable. So a bench that compares against an engine asks for one here:

- `docker_engine`: the engine that already answers (`DOCKER_HOST` or the
  default socket), else a private `dockerd` under the stack's state directory
  with no bridge, no iptables and no masquerading (it must not touch the
  host's network), stopped by `close()`.
- `podman_engine`: podman has no daemon; it gets storage of its own under the
  state directory (`--root`, `--runroot`), so the bench never touches the
  host's images, and the file and process limits its containers need here
  (podman 4.3's defaults ask for more than the machine grants without
  CAP_SYS_RESOURCE, and every container then fails: FIELD-NOTES).

Either way the engine gets the same busybox rootfs Corral's sandboxes run
(`sandbox/oci_archive.py`), imported as `busybox` when it has none.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from sandbox.oci_archive import build_busybox_rootfs

PEER_IMAGE = "busybox"
DAEMON_START_S = 60.0
# What podman's containers need on these machines (FIELD-NOTES: its defaults
# fail without CAP_SYS_RESOURCE).
PODMAN_RUN_FLAGS = ["--ulimit", "nofile=20000:20000", "--ulimit", "nproc=32768:32768"]


class EngineUnavailable(Exception):
    """No engine could be had; the message is the one-line reason."""


@dataclass
class Engine:
    """A container engine's CLI bound to one daemon (`argv` prefixes every call)."""

    name: str
    argv: list[str]
    daemon: asyncio.subprocess.Process | None = None  # ours to stop
    run_flags: list[str] = field(default_factory=list)  # what `run` needs on this machine

    def run_argv(self, *args: str) -> list[str]:
        """`<engine> run <run_flags> args...`, for callers that run it themselves."""
        return [*self.argv, "run", *self.run_flags, *args]

    async def run(self, *args: str, stdin: bytes | None = None) -> str:
        """Run `<engine> args...`; its stdout, or RuntimeError with stderr's tail."""
        proc = await asyncio.create_subprocess_exec(
            *self.argv,
            *args,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate(stdin)
        if proc.returncode != 0:
            tail = " ".join(err.decode(errors="replace").split())[-300:]
            raise RuntimeError(f"{self.name} {args[0]} exited {proc.returncode}: {tail}")
        return out.decode(errors="replace")

    async def close(self) -> None:
        """Stop the daemon this bench started (an engine found running stays)."""
        if self.daemon is None or self.daemon.returncode is not None:
            return
        self.daemon.terminate()
        try:
            await asyncio.wait_for(self.daemon.wait(), 30)
        except TimeoutError:
            self.daemon.kill()
            await self.daemon.wait()


async def docker_engine(state_dir: Path) -> Engine:
    """A docker daemon with the busybox image, or EngineUnavailable saying why."""
    docker = shutil.which("docker")
    if docker is None:
        raise EngineUnavailable("docker is not installed (apt-get install docker.io)")
    engine = Engine("docker", [docker])
    if not await _answers(engine):
        engine = await _private_dockerd(docker, state_dir / "peers" / "docker")
    return await _with_busybox(engine)


async def podman_engine(state_dir: Path) -> Engine:
    """podman on storage of its own with the busybox image, or EngineUnavailable saying why."""
    podman = shutil.which("podman")
    if podman is None:
        raise EngineUnavailable("podman is not installed (apt-get install podman)")
    root = state_dir / "peers" / "podman"
    root.mkdir(parents=True, exist_ok=True)
    argv = [
        podman,
        "--root", str(root / "storage"),
        "--runroot", str(root / "run"),
        "--tmpdir", str(root / "tmp"),
        "--cgroup-manager", "cgroupfs",  # no systemd on these machines
        "--events-backend", "file",
    ]  # fmt: skip
    engine = Engine("podman", argv, run_flags=PODMAN_RUN_FLAGS)
    try:
        await engine.run("version", "--format", "{{.Client.Version}}")
    except (RuntimeError, OSError) as err:
        raise EngineUnavailable(f"podman does not run: {err}") from err
    return await _with_busybox(engine)


async def _with_busybox(engine: Engine) -> Engine:
    try:
        await _ensure_busybox(engine)
    except RuntimeError as err:
        await engine.close()
        why = f"{engine.name} has no busybox image and cannot import one: {err}"
        raise EngineUnavailable(why) from err
    return engine


async def _answers(engine: Engine) -> bool:
    try:
        await engine.run("version", "--format", "{{.Server.Version}}")
        return True
    except (RuntimeError, OSError):
        return False


async def _private_dockerd(docker: str, root: Path) -> Engine:
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        raise EngineUnavailable("no docker daemon answers and dockerd is not installed")
    root.mkdir(parents=True, exist_ok=True)
    socket = root / "docker.sock"
    log = (root / "dockerd.log").open("ab")
    daemon = await asyncio.create_subprocess_exec(
        dockerd,
        "--data-root", str(root / "data"),
        "--exec-root", str(root / "exec"),
        "--pidfile", str(root / "dockerd.pid"),
        "-H", f"unix://{socket}",
        "--iptables=false", "--ip-forward=false", "--ip-masq=false", "--bridge=none",
        stdout=log, stderr=log,
    )  # fmt: skip
    log.close()
    engine = Engine("docker", [docker, "-H", f"unix://{socket}"], daemon)
    deadline = asyncio.get_running_loop().time() + DAEMON_START_S
    while asyncio.get_running_loop().time() < deadline:
        if daemon.returncode is not None:
            raise EngineUnavailable(f"dockerd exited {daemon.returncode}: see {root}/dockerd.log")
        if socket.exists() and await _answers(engine):
            return engine
        await asyncio.sleep(0.3)
    await engine.close()
    raise EngineUnavailable(f"dockerd did not answer in {DAEMON_START_S:g} s: {root}/dockerd.log")


async def _ensure_busybox(engine: Engine) -> None:
    with contextlib.suppress(RuntimeError):
        await engine.run("image", "inspect", PEER_IMAGE)
        return
    with tempfile.TemporaryDirectory(prefix="corral-peer-") as tmp:
        rootfs = build_busybox_rootfs(Path(tmp) / "rootfs")
        archive = Path(tmp) / "rootfs.tar"
        with tarfile.open(archive, "w") as tar:
            tar.add(rootfs, arcname=".")
        await engine.run("import", str(archive), PEER_IMAGE)
