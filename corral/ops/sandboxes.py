"""A one-off sandbox straight on a node's containerd, without Temporal
(`corral sandbox run`): made, one command run, torn down."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from contract.config import StackConfig, describe_validation_error
from contract.errors import CorralError
from contract.ids import resolve_image_name
from corral.ops.images import node_client
from sandbox.models import ExecResult, SandboxSpec


class InvalidSandbox(CorralError):
    """The sandbox asked for is not one the sandbox layer would make."""


class SandboxRunFailed(CorralError):
    """The sandbox could not be made, or the command not run in it."""


def sandbox_spec(
    image: str = "busybox",
    *,
    memory_mb: int = 512,
    cpus: float = 1.0,
    pids: int = 256,
    runtime: str = "runc",
    read_only_root: bool = False,
    workspace_mb: int | None = None,
    network: str = "none",
    egress: Sequence[dict[str, Any]] = (),
    labels: dict[str, str] | None = None,
) -> SandboxSpec:
    """A checked sandbox spec: /tmp and /dev/shm sized below the memory limit, and
    /tmp the working directory of a read-only root with no workspace volume.
    `egress` rules are `{"cidr", "port" (None: any), "protocol"}` (network
    "allowlist"). Raises `InvalidSandbox` naming what is wrong."""
    try:
        return SandboxSpec.model_validate(
            {
                "image": resolve_image_name(image),
                "memory_mb": memory_mb,
                "cpu_cores": cpus,
                "pids_limit": pids,
                "runtime": runtime,
                "read_only_root": read_only_root,
                "workspace_mb": workspace_mb,
                "network": network,
                "tmpfs_mb": max(1, min(64, memory_mb // 4)),  # /tmp + /dev/shm below the limit
                "egress": list(egress),
                "labels": labels if labels is not None else {"corral.cli": "sandbox-run"},
                # the default /workspace is in the image; a read-only root has no writable cwd
                **({"workdir": "/tmp"} if read_only_root and workspace_mb is None else {}),
            }
        )
    except ValidationError as err:
        raise InvalidSandbox(f"invalid sandbox: {describe_validation_error(err)}") from err


async def run_in_sandbox(
    config: StackConfig,
    spec: SandboxSpec,
    command: list[str] | str,
    *,
    timeout_s: float = 60.0,
    node: str | None = None,
) -> ExecResult:
    """Make a sandbox of `spec` on node `node` (default: the first), run `command`
    in it (a string runs through /bin/sh -c), tear it down and return the result
    (exit code 137 with `timed_out` when it was killed at `timeout_s`).
    Raises `SandboxRunFailed` when the sandbox could not be made or the command
    not started; the sandbox is removed in every case."""
    sandbox_id = f"cli-{uuid.uuid4().hex[:12]}"
    async with node_client(config, node or config.node_names()[0]) as client:
        try:
            try:
                box = await client.create_sandbox(sandbox_id, spec, spec.labels)
                return await box.exec(command, timeout_s=timeout_s)
            except CorralError as err:
                raise SandboxRunFailed(f"sandbox: {err}") from err
        finally:
            with contextlib.suppress(CorralError):
                await client.destroy_sandbox(sandbox_id)
