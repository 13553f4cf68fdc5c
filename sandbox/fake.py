"""`FakeRuntime`: an in-memory `SandboxRuntime` (sandbox/runtime.py) for unit tests.

Like SWE-ReX's DummyRuntime, it lives in the package so that every test (and
a simulation) shares one fake rather than faking containerd its own way.
Sandboxes, labels, files, pause state and images are dicts and sets; it raises
the sandbox layer's own errors where containerd would (`SandboxNotFound`,
`ImageNotFound`, `SandboxPaused`, `FileNotFound`, `SandboxStateError`,
`ExecFailed`). A command "runs" by `FakeRuntime.script` (the command line ->
its result), else `FakeRuntime.on_exec` (a callback, may be async), else a few
shell words: `echo`, `true`, `false`, `exit N`, `cat PATH`; anything else
exits 127. An exec outlives a cancelled caller, as one in a shim does, until
its sandbox is destroyed, so `reattach_exec` finds it.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import shlex
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from contract.errors import (
    ExecFailed,
    FileNotFound,
    ImageNotFound,
    SandboxError,
    SandboxNotFound,
    SandboxPaused,
    SandboxStateError,
)
from contract.ids import resolve_image_name
from contract.labels import IMAGE_LABEL, NETWORK_LABEL, SANDBOX_LABEL
from sandbox.models import ExecResult, ImageInfo, SandboxInfo, SandboxSpec, validate_sandbox_id
from sandbox.sandbox import RawExecResult

if TYPE_CHECKING:
    from sandbox.agent import AgentChannel
    from sandbox.registry import RegistryOptions
    from sandbox.runtime import SandboxRuntime

__all__ = ["FakeCall", "FakeImages", "FakePulls", "FakeRuntime", "FakeSandbox"]

KILLED_EXIT_CODE = 137  # a timed-out exec is SIGKILLed
NOT_FOUND_EXIT_CODE = 127


@dataclass
class FakeCall:
    """One exec as `on_exec` sees it."""

    sandbox: FakeSandbox
    argv: list[str]
    env: dict[str, str]
    stdin: bytes | None

    @property
    def cmd(self) -> str:
        """The command line: the script of `/bin/sh -c`, else the argv joined."""
        if self.argv[:2] == ["/bin/sh", "-c"] and len(self.argv) > 2:
            return self.argv[2]
        return shlex.join(self.argv)


ExecHandler = Callable[[FakeCall], ExecResult | Awaitable[ExecResult]]


class FakeImages:
    """The node's images, by resolved name."""

    def __init__(self, names: Iterable[str] = ()) -> None:
        self.names = {resolve_image_name(name) for name in names}

    def add(self, name: str) -> None:
        self.names.add(resolve_image_name(name))

    async def get(self, name: str) -> ImageInfo:
        full = resolve_image_name(name)
        if full not in self.names:
            raise ImageNotFound(f"image {full!r}: not found")
        digest = "sha256:" + hashlib.sha256(full.encode()).hexdigest()
        return ImageInfo(
            name=full, digest=digest, media_type="application/vnd.oci.image.manifest.v1+json"
        )

    async def remove(self, name: str) -> None:
        full = resolve_image_name(name)
        if full not in self.names:
            raise ImageNotFound(f"image {full!r}: not found")
        self.names.discard(full)


class FakePulls:
    """Pull-on-first-use from a registry holding `registry`'s images."""

    def __init__(self, images: FakeImages, registry: Iterable[str] = ()) -> None:
        self._images = images
        self.registry = {resolve_image_name(name) for name in registry}
        self.pulled: list[str] = []

    async def ensure(self, name: str, options: RegistryOptions) -> ImageInfo:
        full = resolve_image_name(name)
        if full not in self._images.names and full in self.registry:
            self._images.add(full)
            self.pulled.append(full)
        return await self._images.get(full)


class FakeSandbox:
    """One sandbox: its labels, files and state, and the execs it runs."""

    def __init__(
        self, runtime: FakeRuntime, sandbox_id: str, spec: SandboxSpec, labels: dict[str, str]
    ) -> None:
        self._runtime = runtime
        self.id = sandbox_id
        self.image = resolve_image_name(spec.image)
        self.labels = labels
        self.spec = spec
        self.state = "running"
        self.files: dict[str, tuple[bytes, int]] = {}  # path -> (data, mode)
        self.execs: dict[str, asyncio.Task[RawExecResult]] = {}
        self.network_cut = False
        self.created_at = datetime.now(UTC)
        self.host_pid = 4000 + len(runtime.sandboxes)

    def __repr__(self) -> str:
        return f"FakeSandbox(id={self.id!r}, image={self.image!r}, state={self.state!r})"

    # -- exec ------------------------------------------------------------------
    async def exec(self, cmd: list[str] | str, *, timeout_s: float | None = None) -> ExecResult:
        args = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        task = self._start(args, {}, None)
        return (await _waited(task, timeout_s)).decoded()

    async def exec_durable(
        self,
        args: list[str],
        *,
        exec_id: str,
        output_dir: Path,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        stdin: bytes | None = None,
        timeout_s: float | None = None,
        output_limit_bytes: int = 1_048_576,
    ) -> RawExecResult:
        if exec_id in self.execs:
            raise ExecFailed(f"exec {exec_id} in sandbox {self.id!r}: it exists already")
        output_dir.mkdir(parents=True, exist_ok=True)  # the real one's output files go there
        task = self._start(args, env or {}, stdin)
        self.execs[exec_id] = task
        return _limited(await _waited(task, timeout_s), output_limit_bytes)

    async def reattach_exec(
        self,
        exec_id: str,
        output_dir: Path,
        *,
        timeout_s: float | None,
        output_limit_bytes: int = 1_048_576,
    ) -> RawExecResult | None:
        task = self.execs.get(exec_id)
        if task is None:
            return None
        return _limited(await _waited(task, timeout_s), output_limit_bytes)

    def _start(
        self, args: list[str], env: dict[str, str], stdin: bytes | None
    ) -> asyncio.Task[RawExecResult]:
        self._refuse_if_paused("exec")
        call = FakeCall(self, args, env, stdin)
        self._runtime.ran.append((self.id, call.cmd))
        return asyncio.ensure_future(self._runtime.run(call))

    async def agent_channel(self) -> AgentChannel | None:
        return None  # no exec agent: sessions and jobs are refused (AgentUnavailable)

    # -- files -----------------------------------------------------------------
    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        self._refuse_if_paused("write")
        self.files[path] = (data, mode)

    async def read_file(self, path: str, max_bytes: int = 64 * 1024 * 1024) -> bytes:
        self._refuse_if_paused("read")
        if path not in self.files:
            raise FileNotFound(f"no file {path!r} in sandbox {self.id!r}")
        data = self.files[path][0]
        if len(data) > max_bytes:
            raise SandboxError(f"read {path!r} in sandbox {self.id!r}: larger than {max_bytes} B")
        return data

    # -- state -----------------------------------------------------------------
    async def pause(self) -> None:
        if self.state != "running":
            raise SandboxStateError(f"pause sandbox {self.id!r}: it is {self.state}")
        self.state = "paused"

    async def resume(self) -> None:
        if self.state != "paused":
            raise SandboxStateError(f"resume sandbox {self.id!r}: it is {self.state}")
        self.state = "running"

    async def status(self) -> str:
        return self.state

    async def pid(self) -> int:
        if self.state == "stopped":
            raise SandboxNotFound(f"sandbox {self.id!r} is gone")
        return self.host_pid

    async def root_path(self) -> Path:
        root = self._runtime.rootfs_dir
        if root is None:
            raise SandboxError(f"sandbox {self.id!r}: this FakeRuntime has no rootfs_dir")
        path = root / self.id
        (path / "etc").mkdir(parents=True, exist_ok=True)
        return path

    async def cut_network(self) -> bool:
        if self.spec.network != "allowlist":
            return False
        self.network_cut = True
        return True

    async def restore_network(self) -> bool:
        if self.spec.network != "allowlist":
            return False
        self.network_cut = False
        return True

    def _refuse_if_paused(self, what: str) -> None:
        if self.state == "stopped":
            raise SandboxNotFound(f"{what} in sandbox {self.id!r}: it is gone")
        if self.state != "running":
            raise SandboxPaused(
                f"{what} in sandbox {self.id!r}: sandbox is paused; resume it first"
            )


class FakeRuntime:
    """One node's containerd, in memory. `images`: the images the node holds."""

    def __init__(
        self,
        images: Iterable[str] = ("busybox",),
        *,
        registry: Iterable[str] = (),
        on_exec: ExecHandler | None = None,
        rootfs_dir: Path | None = None,
    ) -> None:
        self.images = FakeImages(images)
        self.pulls = FakePulls(self.images, registry)
        self.sandboxes: dict[str, FakeSandbox] = {}
        self.script: dict[str, ExecResult] = {}  # a command line -> what it returns
        self.on_exec = on_exec
        self.rootfs_dir = rootfs_dir
        self.ran: list[tuple[str, str]] = []  # (sandbox id, command line), in order
        # Rootfs snapshots whose sandbox never came (a create cut off), by their
        # creation time, and a userns remap's leftovers: for the reaper.
        self.orphans: dict[str, float] = {}
        self.stale_remaps: list[str] = []

    def result(self, cmd: str, exit_code: int = 0, stdout: str = "", stderr: str = "") -> None:
        """Script `cmd`'s result."""
        self.script[cmd] = _out(exit_code, stdout, stderr)

    async def create_sandbox(
        self, sandbox_id: str, spec: SandboxSpec, labels: dict[str, str] | None = None
    ) -> FakeSandbox:
        validate_sandbox_id(sandbox_id)
        existing = self.sandboxes.get(sandbox_id)
        if existing is not None:
            return existing
        image = await self.images.get(spec.image)
        all_labels = {
            **spec.labels,
            **(labels or {}),
            SANDBOX_LABEL: "1",
            IMAGE_LABEL: image.name,
            NETWORK_LABEL: spec.network,
        }
        sandbox = FakeSandbox(self, sandbox_id, spec, all_labels)
        self.sandboxes[sandbox_id] = sandbox
        return sandbox

    async def get_sandbox(self, sandbox_id: str) -> FakeSandbox:
        sandbox = self.sandboxes.get(sandbox_id)
        if sandbox is None:
            raise SandboxNotFound(f"sandbox {sandbox_id!r} does not exist")
        return sandbox

    async def list_sandboxes(self, label_filter: dict[str, str] | None = None) -> list[SandboxInfo]:
        wanted = {SANDBOX_LABEL: "1", **(label_filter or {})}
        return [
            SandboxInfo(
                id=box.id,
                image=box.image,
                labels=dict(box.labels),
                status="paused" if box.state == "paused" else "running",
                pid=box.host_pid,
                created_at=box.created_at,
            )
            for box in self.sandboxes.values()
            if all(box.labels.get(key) == value for key, value in wanted.items())
        ]

    async def update_labels(self, sandbox_id: str, labels: dict[str, str]) -> dict[str, str]:
        sandbox = await self.get_sandbox(sandbox_id)
        sandbox.labels = {**sandbox.labels, **labels}
        return dict(sandbox.labels)

    async def destroy_sandbox(self, sandbox_id: str) -> bool:
        removed = self.orphans.pop(sandbox_id, None) is not None
        sandbox = self.sandboxes.pop(sandbox_id, None)
        if sandbox is None:
            return removed
        sandbox.state = "stopped"
        for task in sandbox.execs.values():
            task.cancel()
        return True

    async def orphan_snapshots(self, containers: set[str], older_than_s: float) -> list[str]:
        now = time.time()
        return sorted(
            key
            for key, made in self.orphans.items()
            if key not in containers and now - made >= older_than_s
        )

    async def clear_stale_remaps(self, older_than_s: float) -> list[str]:
        cleared, self.stale_remaps = self.stale_remaps, []
        return cleared

    async def run(self, call: FakeCall) -> RawExecResult:
        """What the command does: the script, else `on_exec`, else the shell words."""
        started = time.monotonic()
        scripted = self.script.get(call.cmd)
        if scripted is not None:
            out = scripted
        elif self.on_exec is not None:
            answer = self.on_exec(call)
            out = await answer if inspect.isawaitable(answer) else answer
        else:
            out = _shell_word(call)
        return RawExecResult(
            exit_code=out.exit_code,
            stdout=out.stdout.encode(),
            stderr=out.stderr.encode(),
            duration_s=out.duration_s or time.monotonic() - started,
            timed_out=out.timed_out,
            truncated=out.truncated,
        )


def _shell_word(call: FakeCall) -> ExecResult:
    """The few shell words the fake knows without a script."""
    try:
        words = shlex.split(call.cmd)
    except ValueError:
        words = [call.cmd]
    name, args = (words[0], words[1:]) if words else ("", [])
    if name == "echo":
        return _out(0, " ".join(args) + "\n")
    if name in ("true", "false"):
        return _out(int(name == "false"))
    if name == "exit" and len(args) == 1 and args[0].isdigit():
        return _out(int(args[0]))
    if name == "cat" and len(args) == 1:
        found = call.sandbox.files.get(args[0])
        if found is None:
            return _out(1, stderr=f"cat: {args[0]}: No such file\n")
        return _out(0, found[0].decode(errors="replace"))
    return _out(NOT_FOUND_EXIT_CODE, stderr=f"sh: {name}: not found\n")


def _out(exit_code: int, stdout: str = "", stderr: str = "") -> ExecResult:
    return ExecResult(exit_code=exit_code, stdout=stdout, stderr=stderr, duration_s=0.0)


async def _waited(task: asyncio.Task[RawExecResult], timeout_s: float | None) -> RawExecResult:
    """The exec's result; killed after `timeout_s` or with its sandbox. A cancelled
    caller leaves it running."""
    try:
        return await asyncio.wait_for(asyncio.shield(task), timeout_s)
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if task.cancelled() and not (current is not None and current.cancelling()):
            return RawExecResult(KILLED_EXIT_CODE, b"", b"", 0.0, False, False)  # destroyed
        raise
    except TimeoutError:
        task.cancel()
        return RawExecResult(KILLED_EXIT_CODE, b"", b"", timeout_s or 0.0, True, False)


def _limited(raw: RawExecResult, limit: int) -> RawExecResult:
    if len(raw.stdout) <= limit and len(raw.stderr) <= limit:
        return raw
    return RawExecResult(
        raw.exit_code, raw.stdout[:limit], raw.stderr[:limit], raw.duration_s, raw.timed_out, True
    )


if TYPE_CHECKING:  # mypy holds the fake to the protocol
    _fake: type[SandboxRuntime] = FakeRuntime
