"""OCI runtime spec builder: a pure function from SandboxSpec to the spec JSON.

The sandbox is a fresh set of namespaces (pid, ipc, uts, mount, network with
loopback only), no new privileges, Docker's default capabilities minus
NET_RAW and MKNOD, the masked and read-only /proc and /sys paths runc users
know from Docker, cgroup limits (memory+swap, pids, cpu quota and shares),
RLIMIT_NOFILE, size-capped tmpfs for /tmp and /dev/shm, the seccomp
profile of ``sandbox.seccomp``, tini as PID 1 (bind-mounted read-only from the
host), and with ``workspace_mb`` a bind mount of the sandbox's volume
(``sandbox.volumes``) at /workspace. docs/sandbox.md has the whole picture.

cgroupsPath is ``/corral/<sandbox_id>``: with cgroupfs (v1 here) the leaf
directory is the container id, which the sensor maps cgroup ids back with.

With ``user_namespace`` (the default) the sandbox also gets a user namespace
whose ids 0..size-1 are an unprivileged host range (``sandbox.userns``); the
rootfs is a chowned copy of the image for that range, because runc 1.1.5 has
no idmapped rootfs. ``blockIO`` throttles the device that holds the writable
layer (``sandbox.quota``) when the client knows it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sandbox.models import SandboxSpec, parse_user
from sandbox.seccomp import seccomp_profile
from sandbox.userns import IdMapping, UidPool

OCI_VERSION = "1.0.2-dev"
CPU_PERIOD_US = 100_000
MIB = 1024 * 1024
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CGROUP_PARENT = "/corral"

# The reaping inits, bind-mounted read-only from the host into every sandbox,
# so they work with any image and the agent cannot replace them. PID 1 of a pid
# namespace inherits every orphan; the init reaps them (with `sleep` as PID 1
# they stay zombies and use up pids_limit) and forwards SIGTERM to `command`.
# catatonit (Debian's, static) is the default: it sleeps on a signalfd, while
# tini wakes every second (sigtimedwait with a 1 s timeout) - 5,000 idle
# sandboxes meant 5,000 wakeups a second in weight-2 cgroups.
HOST_INITS = {
    "catatonit": Path("/usr/bin/catatonit"),
    "tini": Path("/usr/bin/tini-static"),
}
INIT_PATH = "/.corral/init"
# The exec agent (agent/, docs/agent.md): PID 1 instead of the init when on.
AGENT_PATH = "/.corral/agent"
WORKSPACE = "/workspace"
SHIM_GROUP_ANNOTATION = "io.containerd.runc.v2.group"

# PID 1 keeps the sandbox alive; under memory pressure inside the sandbox the
# kernel should pick the agent's processes first. Exec processes get
# EXEC_OOM_SCORE_ADJ (set in their process spec), PID 1 a lower score.
INIT_OOM_SCORE_ADJ = 100
EXEC_OOM_SCORE_ADJ = 500

# Docker's default set minus NET_RAW (raw sockets: spoofing, sniffing) and
# MKNOD (no device nodes are needed; the devices cgroup denies them anyway).
CAPABILITIES = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
]

MASKED_PATHS = [
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/proc/kpagecgroup",
    "/proc/kpagecount",
    "/proc/kpageflags",
    "/proc/sysrq-trigger",
    "/proc/kmsg",
    "/proc/slabinfo",
    "/proc/vmallocinfo",
    "/sys/firmware",
    "/sys/kernel/debug",
    "/sys/kernel/tracing",
    "/sys/kernel/security",
    "/sys/devices/virtual/powercap",
]

READONLY_PATHS = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys"]

# Character devices a process may use (runc creates the nodes itself).
ALLOWED_DEVICES = [
    (1, 3),  # null
    (1, 5),  # zero
    (1, 7),  # full
    (1, 8),  # random
    (1, 9),  # urandom
    (5, 0),  # tty
    (5, 2),  # ptmx
    (136, None),  # pts/*
]


def cgroups_path(sandbox_id: str) -> str:
    return f"{CGROUP_PARENT}/{sandbox_id}"


def init_args(spec: SandboxSpec) -> list[str]:
    """PID 1's argv: ``command`` under the reaping init, or ``command`` itself."""
    if spec.init in HOST_INITS:
        return [INIT_PATH, "--", *spec.command]
    return list(spec.command)


def build_oci_spec(
    sandbox_id: str,
    spec: SandboxSpec,
    *,
    workspace_source: str | None = None,
    userns: IdMapping | None = None,
    io_device: tuple[int, int] | None = None,
    agent: Path | None = None,
) -> dict[str, Any]:
    """The full runtime spec (JSON-able dict) for one sandbox.

    ``workspace_source`` is the host directory (the mounted workspace volume)
    bind-mounted at /workspace when ``spec.workspace_mb`` is set; ``userns`` the
    id mapping when ``spec.user_namespace`` is on (default: range
    ``spec.userns_range`` of the default pool); ``io_device`` the (major, minor)
    of the block device under the writable layer, throttled by
    ``spec.io_bps_mb``/``spec.io_iops``; ``agent`` the host path of the exec
    agent, which then is PID 1 (it reaps, as the init would) and runs ``command``.
    """
    if spec.user_namespace and userns is None:
        userns = UidPool().mapping(spec.userns_range)
    if spec.workspace_mb is not None and workspace_source is None:
        raise ValueError("workspace_mb is set: build_oci_spec needs workspace_source")
    oci: dict[str, Any] = {
        "ociVersion": OCI_VERSION,
        "process": build_process(
            [AGENT_PATH, "--", *spec.command] if agent is not None else init_args(spec),
            spec,
            env=None,
            workdir=None,
            user=None,
            oom_adj=INIT_OOM_SCORE_ADJ,
        ),
        "root": {"path": "rootfs", "readonly": spec.read_only_root},
        "hostname": sandbox_id[:63],
        "mounts": _mounts(spec, workspace_source, agent),
        "linux": _linux(sandbox_id, spec, userns if spec.user_namespace else None, io_device),
    }
    if spec.shim_group:
        # The runc v2 shim reads the group from the spec's annotations (not the
        # container's labels): sandboxes of one group share one shim process.
        oci["annotations"] = {SHIM_GROUP_ANNOTATION: spec.shim_group}
    return oci


def build_process(
    args: list[str],
    spec: SandboxSpec,
    *,
    env: dict[str, str] | None,
    workdir: str | None,
    user: str | None,
    oom_adj: int = EXEC_OOM_SCORE_ADJ,
) -> dict[str, Any]:
    """An OCI ``process`` object: PID 1's, or an exec's (with overrides)."""
    uid, gid = parse_user(user or spec.user)
    merged_env = {"PATH": DEFAULT_PATH, "HOME": "/root" if uid == 0 else "/tmp"}
    merged_env.update(spec.env)
    merged_env.update(env or {})
    return {
        "terminal": False,
        "user": {"uid": uid, "gid": gid},
        "args": list(args),
        "env": [f"{key}={value}" for key, value in merged_env.items()],
        "cwd": workdir or spec.workdir,
        "capabilities": {
            "bounding": CAPABILITIES,
            "effective": CAPABILITIES if uid == 0 else [],
            "permitted": CAPABILITIES if uid == 0 else [],
        },
        "rlimits": [{"type": "RLIMIT_NOFILE", "hard": spec.nofile, "soft": spec.nofile}],
        "noNewPrivileges": True,
        "oomScoreAdj": oom_adj,
    }


def exec_process(
    base: dict[str, Any],
    args: list[str],
    *,
    env: dict[str, str] | None,
    workdir: str | None,
    user: str | None,
) -> dict[str, Any]:
    """An exec's process, derived from PID 1's process object of a live sandbox."""
    process = dict(base)
    process["args"] = list(args)
    process["oomScoreAdj"] = EXEC_OOM_SCORE_ADJ
    if env:
        merged = dict(item.split("=", 1) for item in base.get("env", []) if "=" in item)
        merged.update(env)
        process["env"] = [f"{key}={value}" for key, value in merged.items()]
    if workdir:
        process["cwd"] = workdir
    if user:
        uid, gid = parse_user(user)
        process["user"] = {"uid": uid, "gid": gid}
        caps = base.get("capabilities", {}).get("bounding", [])
        process["capabilities"] = {
            "bounding": caps,
            "effective": caps if uid == 0 else [],
            "permitted": caps if uid == 0 else [],
        }
    return process


def _tmpfs(destination: str, size_mb: int, *extra: str) -> dict[str, Any]:
    return {
        "destination": destination,
        "type": "tmpfs",
        "source": "tmpfs",
        "options": ["nosuid", "nodev", *extra, f"size={size_mb}m"],
    }


def _mounts(
    spec: SandboxSpec, workspace_source: str | None, agent: Path | None = None
) -> list[dict[str, Any]]:
    mounts = [
        {
            "destination": "/proc",
            "type": "proc",
            "source": "proc",
            "options": ["nosuid", "noexec", "nodev"],
        },
        {
            "destination": "/dev",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
        },
        {
            "destination": "/dev/pts",
            "type": "devpts",
            "source": "devpts",
            "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"],
        },
        _tmpfs("/dev/shm", spec.tmpfs_mb, "noexec", "mode=1777"),
        {
            "destination": "/dev/mqueue",
            "type": "mqueue",
            "source": "mqueue",
            "options": ["nosuid", "noexec", "nodev"],
        },
        {
            "destination": "/sys",
            "type": "sysfs",
            "source": "sysfs",
            "options": ["nosuid", "noexec", "nodev", "ro"],
        },
        {
            "destination": "/sys/fs/cgroup",
            "type": "cgroup",
            "source": "cgroup",
            "options": ["nosuid", "noexec", "nodev", "relatime", "ro"],
        },
        _tmpfs("/tmp", spec.tmpfs_mb, "mode=1777"),
    ]
    if agent is not None:
        mounts.append(
            {
                "destination": AGENT_PATH,
                "type": "bind",
                "source": str(agent),
                "options": ["rbind", "ro", "nosuid", "nodev"],
            }
        )
    elif spec.init in HOST_INITS:
        mounts.append(
            {
                "destination": INIT_PATH,
                "type": "bind",
                "source": str(HOST_INITS[spec.init]),
                "options": ["rbind", "ro", "nosuid", "nodev"],
            }
        )
    if workspace_source is not None:
        mounts.append(
            {
                "destination": WORKSPACE,
                "type": "bind",
                "source": workspace_source,
                "options": ["rbind", "rw", "nosuid", "nodev"],
            }
        )
    return mounts


def _block_io(spec: SandboxSpec, device: tuple[int, int] | None) -> dict[str, Any]:
    """cgroup v1 blkio throttles (bytes and IOs per second, read and write) on one device."""
    if device is None:
        return {}
    major, minor = device
    limits: dict[str, Any] = {}
    for key, rate in (("Bps", spec.io_bps_mb and spec.io_bps_mb * MIB), ("IOPS", spec.io_iops)):
        if rate:
            entry = [{"major": major, "minor": minor, "rate": rate}]
            limits[f"throttleRead{key}Device"] = entry
            limits[f"throttleWrite{key}Device"] = entry
    return {"blockIO": limits} if limits else {}


def _resources(spec: SandboxSpec, io_device: tuple[int, int] | None) -> dict[str, Any]:
    memory = spec.memory_mb * MIB
    cpu: dict[str, Any] = {"quota": int(spec.cpu_cores * CPU_PERIOD_US), "period": CPU_PERIOD_US}
    if spec.cpu_shares is not None:
        cpu["shares"] = spec.cpu_shares
    return {
        **_block_io(spec, io_device),
        "devices": [
            {"allow": False, "access": "rwm"},
            *(
                {
                    "allow": True,
                    "type": "c",
                    "major": major,
                    "access": "rwm",
                    **({"minor": minor} if minor is not None else {}),
                }
                for major, minor in ALLOWED_DEVICES
            ),
        ],
        # OCI's swap is memory+swap (memory.memsw.limit_in_bytes on v1).
        "memory": {"limit": memory, "swap": memory + spec.swap_mb * MIB},
        "pids": {"limit": spec.pids_limit},
        "cpu": cpu,
    }


def _linux(
    sandbox_id: str, spec: SandboxSpec, userns: IdMapping | None, io_device: tuple[int, int] | None
) -> dict[str, Any]:
    namespaces = ["pid", "ipc", "uts", "mount", "network"]
    linux: dict[str, Any] = {
        "cgroupsPath": cgroups_path(sandbox_id),
        "resources": _resources(spec, io_device),
        "maskedPaths": MASKED_PATHS,
        "readonlyPaths": READONLY_PATHS,
        "seccomp": seccomp_profile(),
    }
    if userns is not None:
        namespaces.append("user")
        linux["uidMappings"] = userns.oci()
        linux["gidMappings"] = userns.oci()
    linux["namespaces"] = [_namespace(ns, spec) for ns in namespaces]
    return linux


def _namespace(kind: str, spec: SandboxSpec) -> dict[str, str]:
    """A new namespace, or (an episode's service) the network of the sandbox it
    serves, and its user namespace: only the owner of a network namespace may
    mount a sysfs for it."""
    joined = spec.join_network_of
    if joined is not None and kind in ("network", "user"):
        return {"type": kind, "path": f"/proc/{joined}/ns/{'net' if kind == 'network' else kind}"}
    return {"type": kind}
