"""The checks a spec passes at start and the sandbox layer passes again on the node.

One function per rule, so `EpisodeSpec` (contract.models) refuses at
`start_episode` exactly what `SandboxSpec` (sandbox/models.py) would refuse on
the node: a bad spec fails as `InvalidEpisodeSpec` before anything runs. Each
raises ValueError naming the value (pydantic turns it into a field error).
"""

from __future__ import annotations

import ipaddress
import re

# Runtimes Corral drives, and the binaries each needs on the node's PATH
# (whether the node has them is the node's own check).
RUNTIME_BINARIES: dict[str, tuple[str, ...]] = {
    "runc": ("runc", "containerd-shim-runc-v2"),
    "crun": ("crun", "containerd-shim-runc-v2"),
    "runsc": ("runsc", "containerd-shim-runsc-v1"),
}

_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_env_keys(env: dict[str, str]) -> dict[str, str]:
    """Every key a variable name (a key with '=' or a space would corrupt the env list)."""
    for key in env:
        if not _ENV_KEY.match(key):
            raise ValueError(f"env key {key!r} is not a valid variable name")
    return env


def check_tmpfs_fits(tmpfs_mb: int, memory_mb: int) -> None:
    # tmpfs pages are charged to the sandbox's memory cgroup: a full /tmp
    # plus a full /dev/shm must leave room for the processes themselves.
    if 2 * tmpfs_mb >= memory_mb:
        raise ValueError(
            f"tmpfs_mb {tmpfs_mb} is too large for memory_mb {memory_mb}: "
            "/tmp and /dev/shm together must stay below memory_mb"
        )


def check_runtime_name(runtime: str) -> str:
    """A runtime Corral drives (whether this host has it is the node's check)."""
    if runtime not in RUNTIME_BINARIES:
        raise ValueError(f"runtime {runtime!r} is not one of {sorted(RUNTIME_BINARIES)}")
    return runtime


def egress_cidr(value: str) -> str:
    """An IPv4 network address in canonical form; ValueError naming the value otherwise."""
    try:
        net = ipaddress.ip_network(value, strict=True)
    except ValueError as exc:
        raise ValueError(f"egress cidr {value!r} is not a network address: {exc}") from exc
    if net.version != 4:
        raise ValueError(f"egress cidr {value!r}: IPv6 is not supported (sandboxes get IPv4)")
    return str(net)
