"""The normalized syscall event that Falco rule conditions are evaluated on.

One ``Event`` per syscall (enter and exit already merged by the sensor: exit
events carry the enter arguments), plus the context Falco's fields read: the
process (with a parent chain), the file descriptor the syscall is about, the
container and the user. Plain slotted dataclasses: the engine reads millions
of attributes per second, so no properties and no validation here.

``args`` is keyed by Falco's argument names (``name``, ``flags``, ``mode``,
``fd``, ``dirfd``, ``res``, ``filename``, ``target``, ``linkpath``,
``oldpath``, ``newpath``, ``request``, ``domain``, ``addr``/``tuple`` ...) and
holds raw values (ints, strings); ``policies.falco.fields`` renders them the
way Falco prints them (``O_RDONLY|O_CLOEXEC``, ``PTRACE_ATTACH``, ``AF_PACKET``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

HOST_CONTAINER_ID = "host"  # Falco's container.id for events outside containers


@dataclass(frozen=True, slots=True)
class MountInfo:
    """One mount of a container, as Falco's container plugin reports it."""

    source: str
    dest: str
    mode: str = "rw"
    rdonly: bool = False
    propagation: str = "rprivate"

    def falco_text(self) -> str:
        """``source:dest:mode:rdonly:propagation`` (Falco's container.mount format)."""
        rdonly = "true" if self.rdonly else "false"
        return f"{self.source}:{self.dest}:{self.mode}:{rdonly}:{self.propagation}"


_PROPAGATIONS = ("rprivate", "private", "rshared", "shared", "rslave", "slave")


def mounts_from_spec(spec_mounts: list[dict[str, Any]]) -> list[MountInfo]:
    """The ``mounts`` of an OCI runtime spec (containerd's container record)."""
    found: list[MountInfo] = []
    for m in spec_mounts:
        options = [str(o) for o in m.get("options") or []]
        rdonly = "ro" in options
        propagation = next((o for o in options if o in _PROPAGATIONS), "rprivate")
        mode = "ro" if rdonly else "rw"
        found.append(MountInfo(str(m.get("source", "")), str(m.get("destination", "")), mode,
                               rdonly, propagation))  # fmt: skip
    return found


@dataclass(slots=True)
class ContainerInfo:
    full_id: str
    name: str = ""
    image: str = ""  # "repo:tag" or "repo@digest", as containerd records it
    labels: dict[str, str] = field(default_factory=dict)
    start_ts: int | None = None  # ns since epoch
    privileged: bool = False  # sandboxes are never privileged
    mounts: list[MountInfo] = field(default_factory=list)

    @property
    def id(self) -> str:
        return self.full_id[:12]


@dataclass(slots=True)
class UserInfo:
    uid: int
    name: str | None = None  # from the container's /etc/passwd, None if unknown
    homedir: str | None = None
    shell: str | None = None
    loginuid: int = -1  # -1 (4294967295 in the kernel) = unset
    loginname: str | None = None


@dataclass(slots=True)
class GroupInfo:
    gid: int
    name: str | None = None


@dataclass(slots=True)
class FdInfo:
    num: int  # -1 for a failed open (Falco's fd.num=-1)
    type: str = "file"  # file directory ipv4 ipv6 unix pipe event signalfd netlink ...
    name: str = ""  # absolute path, or "cip:cport->sip:sport" for sockets
    nameraw: str = ""  # the path exactly as the syscall got it
    flags: int = 0  # open flags when known
    # sockets
    sockfamily: str | None = None  # "ip" or "unix" (Falco's fd.sockfamily)
    l4proto: str | None = None  # tcp udp icmp raw
    lip: str | None = None
    lport: int | None = None
    rip: str | None = None
    rport: int | None = None
    is_server: bool | None = None  # the process owns the server end (accept/listen)
    connected: bool = False
    name_changed: bool = False
    ino: int | None = None

    @property
    def typechar(self) -> str:
        return TYPECHARS.get(self.type, "o")


# Falco's one-character fd types.
TYPECHARS: dict[str, str] = {
    "file": "f",
    "directory": "d",
    "ipv4": "4",
    "ipv6": "6",
    "unix": "u",
    "pipe": "p",
    "event": "e",
    "signalfd": "s",
    "eventpoll": "l",
    "inotify": "i",
    "timerfd": "t",
    "netlink": "n",
    "bpf": "b",
    "userfaultfd": "u",
    "io_uring": "r",
    "memfd": "m",
    "pidfd": "P",
}


@dataclass(slots=True, eq=False)
class Process:
    """A thread group (Falco's "proc"), shared by every event of its threads."""

    pid: int
    ppid: int = 0
    name: str = ""  # comm, at most 15 chars (Falco's proc.name)
    exe: str = ""  # argv[0] (Falco's proc.exe)
    exepath: str = ""  # the resolved executable path
    args: list[str] = field(default_factory=list)  # argv[1:]
    cwd: str = ""
    uid: int = -1
    gid: int = -1
    euid: int = -1
    loginuid: int = -1
    tty: int = 0
    vpid: int | None = None  # pid inside the sandbox's pid namespace
    vpgid: int | None = None
    pgid: int | None = None
    sid: int | None = None
    start_ts: int = 0  # ns, same clock as Event.ts_ns (monotonic from boot)
    cap_effective: int | None = None  # bitmask
    cap_permitted: int | None = None
    is_exe_writable: bool | None = None
    is_exe_upper_layer: bool | None = None  # exe lives in the overlay's upper dir
    is_exe_from_memfd: bool | None = None
    exe_ino: int | None = None
    exe_ino_ctime: int | None = None  # ns since epoch
    exe_ino_mtime: int | None = None
    env: dict[str, str] | None = None  # only when read cheaply (/proc at first sight)
    parent: Process | None = None  # set by the process table; drives pname/aname
    container_id: str | None = None  # full id, None = host
    fds: dict[int, FdInfo] = field(default_factory=dict)
    exited: bool = False

    @property
    def cmdline(self) -> str:
        return " ".join([self.name, *self.args]) if self.args else self.name

    def ancestors(self) -> list[Process]:
        """Parent, grandparent, ... (loop-safe: pid reuse can make cycles)."""
        out: list[Process] = []
        seen = {id(self)}
        p = self.parent
        while p is not None and id(p) not in seen and len(out) < 64:
            out.append(p)
            seen.add(id(p))
            p = p.parent
        return out


@dataclass(slots=True)
class Event:
    type: str  # syscall or Falco event name: openat, execve, connect, procexit, clone ...
    dir: str = "<"  # ">" enter, "<" exit
    ts_ns: int = 0  # CLOCK_MONOTONIC (bpftrace nsecs); wall clock in wall_ns
    tid: int = 0
    pid: int = 0
    args: dict[str, Any] = field(default_factory=dict)
    res: int | None = None
    proc: Process = field(default_factory=lambda: Process(pid=0))
    fd: FdInfo | None = None
    container: ContainerInfo | None = None
    user: UserInfo | None = None
    group: GroupInfo | None = None
    num: int = 0  # sequence number, 1-based (Falco's evt.num; 0 never happens)
    wall_ns: int = 0  # ns since epoch, for evt.time and alert timestamps
    cpu: int | None = None
    hostname: str = ""
    # Set by the sensor for fd.types[N]: the type of fd N of the process, if known.
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def container_id(self) -> str:
        return self.container.id if self.container else HOST_CONTAINER_ID
