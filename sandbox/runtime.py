"""`SandboxRuntime`: the sandbox layer as the node activities program against it.

The seam between Temporal's node activities (`activities/`) and containerd:
exactly the operations they call on `sandbox.client.Containerd` and on the
`Sandbox` handles it returns, as Protocols. `Containerd` satisfies them
structurally (mypy checks it where a node worker passes one); `sandbox/fake.py`
holds `FakeRuntime`, the one in-memory implementation every unit test shares.

A parameter a caller does not pass is left out (the real methods take more,
all optional): a new argument is added here first, then to the fake, whose
signatures a unit test compares with the real client's.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from sandbox.agent import AgentChannel
    from sandbox.models import ExecResult, ImageInfo, SandboxInfo, SandboxSpec
    from sandbox.registry import RegistryOptions
    from sandbox.sandbox import RawExecResult

__all__ = ["RuntimeImages", "RuntimePulls", "RuntimeSandbox", "SandboxRuntime"]


class RuntimeSandbox(Protocol):
    """One live sandbox (`sandbox.sandbox.Sandbox`): exec, files, state, network."""

    @property
    def id(self) -> str: ...

    @property
    def image(self) -> str: ...

    @property
    def labels(self) -> dict[str, str]: ...

    async def exec(self, cmd: list[str] | str, *, timeout_s: float | None = ...) -> ExecResult:
        """Run `cmd` (a str through /bin/sh -c) and wait; never raises on its exit code."""
        ...

    async def exec_durable(
        self,
        args: list[str],
        *,
        exec_id: str,
        output_dir: Path,
        env: dict[str, str] | None = ...,
        workdir: str | None = ...,
        stdin: bytes | None = ...,
        timeout_s: float | None = ...,
        output_limit_bytes: int = ...,
    ) -> RawExecResult:
        """An exec under a fixed id that outlives its caller (`reattach_exec` finds it)."""
        ...

    async def reattach_exec(
        self,
        exec_id: str,
        output_dir: Path,
        *,
        timeout_s: float | None,
        output_limit_bytes: int = ...,
    ) -> RawExecResult | None:
        """The result of an `exec_durable` an earlier caller started; None if it never ran."""
        ...

    async def agent_channel(self) -> AgentChannel | None:
        """The exec agent's channel (sessions, jobs), or None without one."""
        ...

    async def write_file(self, path: str, data: bytes, mode: int = ...) -> None: ...

    async def read_file(self, path: str, max_bytes: int = ...) -> bytes:
        """The file's bytes; FileNotFound when `path` is not a regular file."""
        ...

    async def pause(self) -> None: ...

    async def resume(self) -> None: ...

    async def status(self) -> str:
        """One of "running", "paused", "stopped" (also when gone), "created", "pausing"."""
        ...

    async def pid(self) -> int:
        """The host pid of its PID 1 (its namespaces are reached through it)."""
        ...

    async def root_path(self) -> Path:
        """Its root filesystem as the host reaches it."""
        ...

    async def cut_network(self) -> bool:
        """Quarantine: drop its traffic; False when it has no network to cut."""
        ...

    async def restore_network(self) -> bool:
        """Undo `cut_network`; False when it has no network."""
        ...


class RuntimeImages(Protocol):
    """The node's image store (`sandbox.images.ImageStore`)."""

    async def get(self, name: str) -> ImageInfo:
        """The image; ImageNotFound when this node does not hold it."""
        ...

    async def remove(self, name: str) -> None:
        """ImageNotFound when it is not there (a retried removal)."""
        ...


class RuntimePulls(Protocol):
    """Pull-on-first-use (`sandbox.transfer.Puller`)."""

    async def ensure(self, name: str, options: RegistryOptions) -> ImageInfo:
        """The image, pulled first if it is a registry reference this node lacks;
        ImageNotFound for a local name this node does not hold."""
        ...


class SandboxRuntime(Protocol):
    """One node's containerd (`sandbox.client.Containerd`) as the node activities use it."""

    @property
    def images(self) -> RuntimeImages: ...

    @property
    def pulls(self) -> RuntimePulls: ...

    async def create_sandbox(
        self, sandbox_id: str, spec: SandboxSpec, labels: dict[str, str] | None = ...
    ) -> RuntimeSandbox:
        """Create and start it; the one already alive under that id is returned as is.
        ImageNotFound (nothing made) when the spec's image is not on the node."""
        ...

    async def get_sandbox(self, sandbox_id: str) -> RuntimeSandbox:
        """SandboxNotFound when there is none."""
        ...

    async def list_sandboxes(self, label_filter: dict[str, str] | None = ...) -> list[SandboxInfo]:
        """Corral's sandboxes carrying every label of `label_filter`."""
        ...

    async def update_labels(self, sandbox_id: str, labels: dict[str, str]) -> dict[str, str]:
        """Merge `labels` into the sandbox's (a warm claim names its owner); the result."""
        ...

    async def destroy_sandbox(self, sandbox_id: str) -> bool:
        """Kill and remove all of it (a leftover rootfs snapshot too); False if nothing
        was there. Idempotent."""
        ...

    async def orphan_snapshots(self, containers: set[str], older_than_s: float) -> list[str]:
        """Rootfs snapshots older than `older_than_s` whose sandbox is not in `containers`."""
        ...

    async def clear_stale_remaps(self, older_than_s: float) -> list[str]:
        """Remove what a userns remap cut off mid-way left; what was removed."""
        ...
