"""Pydantic models of the sandbox layer's public API (inputs and results)."""

from __future__ import annotations

import re
import shutil
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from contract.checks import (
    RUNTIME_BINARIES,
    check_env_keys,
    check_runtime_name,
    check_tmpfs_fits,
)
from sandbox.network import EgressRule

RUNTIME_HINTS = {
    "runsc": "gVisor is not installed on this host (no Debian package); use runc",
}

DEFAULT_DISK_MB = 1024
DEFAULT_IO_BPS_MB = 200
DEFAULT_IO_IOPS = 4000
DEFAULT_EGRESS_MBIT = 100
MAX_USERNS_RANGES = 4096

_USER = re.compile(r"^\d+(:\d+)?$")
_SANDBOX_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,75}$")


def validate_sandbox_id(sandbox_id: str) -> str:
    """containerd ids: letters, digits, ``_.-``; we also keep them short for runc's paths."""
    if not _SANDBOX_ID.match(sandbox_id):
        from contract.errors import InvalidSpec

        raise InvalidSpec(
            f"sandbox_id {sandbox_id!r}: use 1-76 of [A-Za-z0-9_.-], starting alphanumeric"
        )
    return sandbox_id


def parse_user(user: str, field: str = "user") -> tuple[int, int]:
    """``"uid"`` or ``"uid:gid"`` (numeric only: no /etc/passwd lookup in the host)."""
    if not _USER.match(user):
        raise ValueError(f"{field} {user!r} must be 'uid' or 'uid:gid' with numbers")
    uid, _, gid = user.partition(":")
    return int(uid), int(gid or uid)


class SandboxSpec(BaseModel):
    """What a sandbox looks like; every limit has a safe default."""

    model_config = ConfigDict(extra="forbid")

    image: str = Field(min_length=1)
    cpu_cores: float = Field(default=1.0, gt=0, le=256)
    cpu_shares: int | None = Field(default=None, ge=2, le=262144)
    memory_mb: int = Field(default=512, ge=16)
    swap_mb: int = Field(default=0, ge=0)
    pids_limit: int = Field(default=256, ge=8)
    nofile: int = Field(default=1024, ge=16, le=1_048_576)
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str = "/workspace"
    user: str = "0:0"
    read_only_root: bool = False
    tmpfs_mb: int = Field(default=64, ge=1)
    # A size-capped ext4 volume (a sparse file on the host, loop-mounted) at
    # /workspace: the only disk quota there is (overlayfs here has none).
    workspace_mb: int | None = Field(default=None, ge=8, le=1_048_576)
    # Quota on the whole writable layer (the overlay upper dir, a btrfs subvolume with a
    # qgroup limit: sandbox.quota); None: unbounded (only where the node has no quota fs).
    disk_mb: int | None = Field(default=DEFAULT_DISK_MB, ge=16, le=1_048_576)
    # cgroup v1 blkio throttling on the device that holds the writable layer.
    io_bps_mb: int | None = Field(default=DEFAULT_IO_BPS_MB, ge=1, le=100_000)
    io_iops: int | None = Field(default=DEFAULT_IO_IOPS, ge=10, le=10_000_000)
    # Root in the sandbox maps to an unprivileged host uid range (sandbox.userns): range
    # `userns_range` of the node's pool. False only where the tenant allows it.
    user_namespace: bool = True
    userns_range: int = Field(default=0, ge=0, le=MAX_USERNS_RANGES - 1)
    # "none": own netns with loopback only; "allowlist": a veth with only `egress` reachable.
    network: Literal["none", "allowlist"] = "none"
    egress: list[EgressRule] = Field(default_factory=list)
    # Token-bucket rate of the allowlist veth, each direction (tc tbf); loopback is not shaped.
    egress_mbit: int | None = Field(default=DEFAULT_EGRESS_MBIT, ge=1, le=100_000)
    # "catatonit" / "tini": a reaping init (the host's static binary, bind-mounted
    # read-only) runs `command`; catatonit never wakes while idle, tini every second.
    # "none": `command` itself is PID 1 (orphaned zombies then pile up against pids_limit).
    init: Literal["catatonit", "tini", "none"] = "catatonit"
    # The exec agent as PID 1 in place of `init` (sandbox/agent.py); None: the
    # client's default (Containerd(exec_agent=...)).
    exec_agent: bool | None = None
    runtime: str = "runc"
    shim_group: str | None = None
    # An episode's service: the host pid of the sandbox whose network namespace it
    # shares (a pod: one loopback, services reached as 127.0.0.1 by name).
    join_network_of: int | None = Field(default=None, ge=1)
    command: list[str] = Field(default_factory=lambda: ["sleep", "2147483647"], min_length=1)
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("env")
    @classmethod
    def _env_keys(cls, env: dict[str, str]) -> dict[str, str]:
        return check_env_keys(env)

    @field_validator("workdir")
    @classmethod
    def _absolute_workdir(cls, workdir: str) -> str:
        if not workdir.startswith("/"):
            raise ValueError(f"workdir {workdir!r} must be an absolute path")
        return workdir

    @field_validator("user")
    @classmethod
    def _numeric_user(cls, user: str) -> str:
        parse_user(user)
        return user

    @field_validator("runtime")
    @classmethod
    def _runtime_available(cls, runtime: str) -> str:
        binaries = RUNTIME_BINARIES[check_runtime_name(runtime)]
        missing = [b for b in binaries if shutil.which(b) is None]
        if missing:
            hint = RUNTIME_HINTS.get(runtime)
            raise ValueError(
                f"runtime {runtime!r} needs {', '.join(missing)} on PATH"
                + (f" ({hint})" if hint else "")
            )
        return runtime

    @model_validator(mode="after")
    def _egress_needs_allowlist(self) -> SandboxSpec:
        if self.egress and self.network != "allowlist":
            raise ValueError(f"egress rules need network='allowlist' (network is {self.network!r})")
        return self

    @model_validator(mode="after")
    def _tmpfs_below_memory(self) -> SandboxSpec:
        check_tmpfs_fits(self.tmpfs_mb, self.memory_mb)
        return self


class ExecResult(BaseModel):
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


class ImageInfo(BaseModel):
    name: str
    digest: str
    media_type: str
    size: int = 0
    chain_id: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)


SandboxStatus = Literal["created", "running", "paused", "pausing", "stopped", "unknown"]


class SandboxInfo(BaseModel):
    id: str
    image: str
    labels: dict[str, str]
    status: SandboxStatus
    pid: int | None
    created_at: datetime | None


class SandboxMetrics(BaseModel):
    cpu_usage_ns: int
    memory_bytes: int
    memory_limit_bytes: int
    pids: int
    oom_kills: int


class SandboxEvent(BaseModel):
    topic: str
    sandbox_id: str
    namespace: str
    timestamp: datetime | None = None
    exec_id: str | None = None
    pid: int | None = None
    exit_status: int | None = None
