"""Falco's syscall fields over ``policies.falco.event.Event``.

Semantics follow Falco's "Supported Fields" reference. Conventions the
compiler relies on:

* An extractor returns ``None`` when the event does not carry the value
  (Falco's ``<NA>``: every comparison with it is false, ``exists`` is false).
* A ``list`` return value means *any of* (Falco's semantics for ``proc.aname``,
  ``proc.apid`` and ``proc.acmdline`` without an index, and for the "either
  end" socket fields ``fd.ip``, ``fd.net``, ``fd.port``, ``fd.proto``): a
  comparison holds when it holds for one element. Those fields are registered
  with their element type (``string``, ``ipaddr``, ``port``...), except
  ``fd.types``.
* ``container.mount*`` (Falco's container plugin) come from the mounts of
  the container's OCI spec as containerd holds it.
* ``ipaddr`` and ``ipnet`` values are address strings (``"10.0.0.1"``); an
  ``ipnet`` field (``fd.net``, ``fd.snet``...) is compared by containment of
  that address in the rule's CIDR.
* ``abstime`` is ns since the epoch, ``reltime`` is ns.
* Events come from sandboxes only, so ``container.id`` is never ``host``
  unless the sensor could not map the cgroup; ``container.privileged`` is
  false; ``k8s.*`` fields are ``None`` (Falco without Kubernetes metadata).
"""

from __future__ import annotations

import fnmatch
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from policies.falco.event import HOST_CONTAINER_ID, Event, FdInfo, MountInfo, Process
from policies.falco.fieldapi import ArgKind, Extractor, FieldRegistry, FieldSpec, FieldType
from policies.sensor import flags as fl

S, N, B, L = FieldType.STRING, FieldType.INT, FieldType.BOOL, FieldType.LIST
IP, NET, PORT = FieldType.IPADDR, FieldType.IPNET, FieldType.PORT
ABS, REL = FieldType.ABSTIME, FieldType.RELTIME
OPT, REQ = ArgKind.OPTIONAL, ArgKind.REQUIRED

Arg = str | int | None


def _plain(fn: Callable[[Event], Any]) -> Extractor:
    return lambda e, _a: fn(e)


# ---------------------------------------------------------------- evt.*

OPEN_TYPES = frozenset({"open", "openat", "openat2", "creat", "open_by_handle_at"})
_IO_READ = frozenset({"read", "readv", "pread64", "preadv", "recvfrom", "recvmsg", "recvmmsg"})
_IO_WRITE = frozenset({"write", "writev", "pwrite64", "pwritev", "sendto", "sendmsg", "sendmmsg"})
_WAIT = frozenset({"nanosleep", "clock_nanosleep", "select", "pselect6", "poll", "ppoll",
                   "epoll_wait", "epoll_pwait", "futex", "wait4", "waitid"})  # fmt: skip


def _open_flags(e: Event) -> int | None:
    if e.type not in OPEN_TYPES:
        return None
    if e.type == "creat":
        return fl.O_CREAT | fl.O_WRONLY | 0o1000
    f = e.args.get("flags")
    return f if isinstance(f, int) else None


def _is_open(pred: Callable[[int], bool]) -> Extractor:
    def ext(e: Event, _a: Arg) -> bool:
        f = _open_flags(e)
        return f is not None and pred(f)

    return ext


def _is_open_exec_evt(e: Event, _a: Arg) -> bool:
    f = _open_flags(e)
    mode = e.args.get("mode")
    creates = f is not None and bool(f & (fl.O_CREAT | fl.O_TMPFILE))
    return creates and isinstance(mode, int) and bool(mode & 0o111)


def render_arg(e: Event, key: str, value: Any) -> str:
    """One argument as Falco prints it."""
    if isinstance(value, (bytes, bytearray)):  # a buffer: its bytes (undecodable ones escaped)
        return bytes(value).decode("utf-8", "surrogateescape")
    if isinstance(value, int):
        if key == "flags" and e.type in OPEN_TYPES:
            return fl.open_flags(value)
        if key == "request" and e.type == "ptrace":
            return fl.ptrace_request(value)
        if key == "domain":
            return fl.address_family(value)
        if key == "type" and e.type in ("socket", "socketpair"):
            return fl.socket_type(value)
        if key in ("dirfd", "linkdirfd", "olddir", "newdir", "olddirfd", "newdirfd"):
            return fl.dirfd(value)
        if key == "mode":
            return fl.mode(value)
        if key == "res" and value < 0:
            return f"{value}({fl.errno_name(value)})"
        if key in ("fd", "newfd", "oldfd") and e.fd is not None and e.fd.num == value:
            return f"{value}(<{e.fd.typechar}>{e.fd.name})"
    if isinstance(value, list | tuple):
        return " ".join(str(v) for v in value)
    return str(value)


def _evt_arg(e: Event, a: Arg) -> str | None:
    key, value = _lookup_arg(e, a)
    return None if key is None else render_arg(e, key, value)


def _evt_rawarg(e: Event, a: Arg) -> Any:
    return _lookup_arg(e, a)[1]


def _lookup_arg(e: Event, a: Arg) -> tuple[str | None, Any]:
    if isinstance(a, int) or (isinstance(a, str) and a.isdigit()):
        keys = list(e.args)
        i = int(a)
        return (keys[i], e.args[keys[i]]) if i < len(keys) else (None, None)
    if a == "res" and "res" not in e.args and e.res is not None:
        return "res", e.res
    if a in e.args:
        return str(a), e.args[a]
    return None, None


def _evt_args(e: Event, _a: Arg) -> str:
    items = list(e.args.items())
    if e.res is not None and "res" not in e.args and e.dir == "<":
        items.insert(0, ("res", e.res))
    return " ".join(f"{k}={render_arg(e, k, v)}" for k, v in items)


def _evt_res(e: Event, _a: Arg) -> str | None:
    return None if e.res is None else fl.errno_name(e.res)


_HMS, _YMDHMS = "%H:%M:%S", "%Y-%m-%d %H:%M:%S"


def _fmt_time(ns: int, fmt: str, nanos: bool) -> str:
    s = time.strftime(fmt, time.localtime(ns // 1_000_000_000))
    return f"{s}.{ns % 1_000_000_000:09d}" if nanos else s


def _iso8601(ns: int) -> str:
    s = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // 1_000_000_000))
    return f"{s}.{ns % 1_000_000_000:09d}Z"


def _abspath(e: Event, a: Arg) -> str | None:
    """evt.abspath: the path argument resolved against cwd and dirfd."""
    names = ("name", "path", "pathname", "filename", "newpath", "linkpath", "target")
    for key in ([str(a)] if a else []) + list(names):
        v = e.args.get(key)
        if isinstance(v, str) and v:
            return fl.resolve_path(v, e.proc.cwd)
    return None


# libsinsp events that are not syscalls (syscall.type is <NA> for them).
_NOT_SYSCALLS = frozenset({
    "procexit", "switch", "signaldeliver", "container", "pluginevent", "asyncevent",
    "notification", "infra", "drop", "page_fault",
})  # fmt: skip

# The two paths of rename/link/symlink (libsinsp's fs.path.source / .target).
_SOURCE_ARGS = ("oldpath", "target")
_TARGET_ARGS = ("newpath", "linkpath")
_PATH_ARGS = ("name", "path", "pathname", "filename")


def _path_arg(keys: tuple[str, ...], resolve: bool) -> Extractor:
    def ext(e: Event, _a: Arg) -> str | None:
        for key in keys:
            v = e.args.get(key)
            if isinstance(v, str) and v:
                return fl.resolve_path(v, e.proc.cwd) if resolve else v
        return None

    return ext


def _fs_path_fields() -> list[FieldSpec]:
    return [
        FieldSpec("fs.path.name", S, _path_arg(_PATH_ARGS, True), description="resolved path"),
        FieldSpec("fs.path.nameraw", S, _path_arg(_PATH_ARGS, False)),
        FieldSpec("fs.path.source", S, _path_arg(_SOURCE_ARGS, True)),
        FieldSpec("fs.path.sourceraw", S, _path_arg(_SOURCE_ARGS, False)),
        FieldSpec("fs.path.target", S, _path_arg(_TARGET_ARGS, True)),
        FieldSpec("fs.path.targetraw", S, _path_arg(_TARGET_ARGS, False)),
        FieldSpec("evt.abspath.src", S, _path_arg(_SOURCE_ARGS, True)),
        FieldSpec("evt.abspath.dst", S, _path_arg(_TARGET_ARGS, True)),
    ]


def _evt_fields() -> list[FieldSpec]:
    return [
        FieldSpec("evt.num", N, _plain(lambda e: e.num), description="event number"),
        FieldSpec("evt.type", S, _plain(lambda e: e.type)),
        FieldSpec("evt.dir", S, _plain(lambda e: e.dir), description="'>' enter, '<' exit"),
        FieldSpec("evt.cpu", N, _plain(lambda e: e.cpu)),
        FieldSpec("evt.time", S, _plain(lambda e: _fmt_time(e.wall_ns, _HMS, True))),
        FieldSpec("evt.time.s", S, _plain(lambda e: _fmt_time(e.wall_ns, _HMS, False))),
        FieldSpec("evt.time.iso8601", S, _plain(lambda e: _iso8601(e.wall_ns))),
        FieldSpec("evt.datetime", S, _plain(lambda e: _fmt_time(e.wall_ns, _YMDHMS, True))),
        FieldSpec("evt.datetime.s", S, _plain(lambda e: _fmt_time(e.wall_ns, _YMDHMS, False))),
        FieldSpec("evt.rawtime", ABS, _plain(lambda e: e.wall_ns)),
        FieldSpec("evt.rawtime.s", N, _plain(lambda e: e.wall_ns // 1_000_000_000)),
        FieldSpec("evt.rawtime.ns", N, _plain(lambda e: e.wall_ns % 1_000_000_000)),
        FieldSpec("evt.reltime", REL, _plain(lambda e: e.ts_ns)),
        FieldSpec("evt.latency", REL, _plain(lambda e: e.extra.get("latency_ns"))),
        FieldSpec("evt.args", S, _evt_args, description="all arguments, rendered"),
        FieldSpec("evt.info", S, _evt_args),
        FieldSpec("evt.arg", S, _evt_arg, REQ, "one argument by name or index, rendered"),
        FieldSpec("evt.rawarg", N, _evt_rawarg, REQ, "one argument, raw value"),
        FieldSpec("evt.res", S, _evt_res, description="SUCCESS or the errno name"),
        FieldSpec("evt.rawres", N, _plain(lambda e: e.res)),
        FieldSpec("evt.failed", B, _plain(lambda e: e.res is not None and e.res < 0)),
        FieldSpec("evt.count", N, _plain(lambda e: 1)),
        FieldSpec("evt.source", S, _plain(lambda e: "syscall")),
        # Plugin events only: <NA> for syscalls.
        FieldSpec("evt.plugininfo", S, _plain(lambda e: None)),
        FieldSpec("evt.hostname", S, _plain(lambda e: e.hostname or socket.gethostname())),
        FieldSpec("evt.is_open_read", B, _is_open(fl.is_read)),
        FieldSpec("evt.is_open_write", B, _is_open(fl.is_write)),
        FieldSpec("evt.is_open_exec", B, _is_open_exec_evt),
        FieldSpec("evt.is_open_create", B, _is_open(lambda f: bool(f & fl.O_CREAT))),
        FieldSpec("evt.is_io", B, _plain(lambda e: e.type in _IO_READ or e.type in _IO_WRITE)),
        FieldSpec("evt.is_io_read", B, _plain(lambda e: e.type in _IO_READ)),
        FieldSpec("evt.is_io_write", B, _plain(lambda e: e.type in _IO_WRITE)),
        FieldSpec("evt.io_dir", S, _plain(_io_dir)),
        FieldSpec("evt.is_wait", B, _plain(lambda e: e.type in _WAIT)),
        FieldSpec("evt.is_syslog", B, _plain(lambda e: bool(e.fd and e.fd.name == "/dev/log"))),
        FieldSpec("evt.is_async", B, _plain(lambda e: False)),
        FieldSpec("evt.abspath", S, _abspath, OPT),
        FieldSpec("evt.type.is", N, lambda e, a: int(e.type == a), REQ, "1 if evt.type is [arg]"),
        FieldSpec("syscall.type", S, _plain(lambda e: None if e.type in _NOT_SYSCALLS else e.type)),
        FieldSpec("evt.is_syscall", B, _plain(lambda e: e.type not in _NOT_SYSCALLS)),
        # The sensor does not copy I/O buffers out of the kernel.
        FieldSpec("evt.buffer", FieldType.BYTES, _plain(lambda e: e.args.get("data"))),
        FieldSpec("evt.buflen", N,
                  _plain(lambda e: e.res if e.type in _IO_READ or e.type in _IO_WRITE else None)),
    ]  # fmt: skip


def _io_dir(e: Event) -> str | None:
    return "r" if e.type in _IO_READ else "w" if e.type in _IO_WRITE else None


# ---------------------------------------------------------------- proc.* / thread.*


def _chain(e: Event) -> list[Process]:
    """proc.aname[0] is the process itself, [1] its parent, ..."""
    return [e.proc, *e.proc.ancestors()]


def _ancestor_field(get: Callable[[Process], Any]) -> Extractor:
    def ext(e: Event, a: Arg) -> Any:
        if a is None:  # any ancestor (not the process itself), like Falco
            return [get(p) for p in e.proc.ancestors()]
        chain = _chain(e)
        i = int(a)
        return get(chain[i]) if 0 <= i < len(chain) else None

    return ext


def _parent(get: Callable[[Process], Any]) -> Extractor:
    def ext(e: Event, _a: Arg) -> Any:
        p = e.proc.parent
        return None if p is None else get(p)

    return ext


def _leader(e: Event, attr: str) -> Process | None:
    """The session / process-group leader: the eldest ancestor sharing the id."""
    want = getattr(e.proc, attr)
    if want is None:
        return None
    found: Process | None = None
    for p in _chain(e):
        if getattr(p, attr) != want:
            break
        found = p
        if (p.vpid if attr == "vpgid" else p.pid) == want:
            return p
    return found


def _leader_field(attr: str, get: Callable[[Process], Any]) -> Extractor:
    def ext(e: Event, _a: Arg) -> Any:
        p = _leader(e, attr)
        return None if p is None else get(p)

    return ext


def _duration(p: Process | None, e: Event) -> int | None:
    if p is None or not p.start_ts:
        return None
    return max(0, e.ts_ns - p.start_ts)


def _exeline(p: Process) -> str:
    return " ".join([p.exe, *p.args])


def _env(e: Event, a: Arg) -> Any:
    env = e.proc.env
    if env is None:
        return None
    if a is None:
        return " ".join(f"{k}={v}" for k, v in env.items())
    return env.get(str(a))


def _proc_fields() -> list[FieldSpec]:
    name = lambda p: p.name  # noqa: E731
    return [
        FieldSpec("proc.pid", N, _plain(lambda e: e.proc.pid)),
        FieldSpec("proc.ppid", N, _plain(lambda e: e.proc.ppid)),
        FieldSpec("proc.vpid", N, _plain(lambda e: e.proc.vpid)),
        FieldSpec("proc.pvpid", N, _parent(lambda p: p.vpid)),
        FieldSpec("proc.name", S, _plain(lambda e: e.proc.name or None)),
        FieldSpec("proc.exe", S, _plain(lambda e: e.proc.exe or None)),
        FieldSpec("proc.exepath", S, _plain(lambda e: e.proc.exepath or None)),
        FieldSpec("proc.args", S, _plain(lambda e: " ".join(e.proc.args))),
        FieldSpec("proc.cmdline", S, _plain(lambda e: e.proc.cmdline or None)),
        FieldSpec("proc.exeline", S, _plain(lambda e: _exeline(e.proc))),
        FieldSpec("proc.cmdnargs", N, _plain(lambda e: len(e.proc.args))),
        FieldSpec("proc.cmdlenargs", N, _plain(lambda e: sum(len(a) for a in e.proc.args))),
        FieldSpec("proc.cwd", S, _plain(lambda e: _dir_slash(e.proc.cwd))),
        FieldSpec("proc.tty", N, _plain(lambda e: e.proc.tty)),
        FieldSpec("proc.loginshellid", N, _plain(_loginshellid)),
        FieldSpec("proc.pname", S, _parent(name)),
        FieldSpec("proc.pcmdline", S, _parent(lambda p: p.cmdline)),
        FieldSpec("proc.pexe", S, _parent(lambda p: p.exe or None)),
        FieldSpec("proc.pexepath", S, _parent(lambda p: p.exepath or None)),
        FieldSpec("proc.aname", S, _ancestor_field(name), OPT, "ancestor name; [0] is self",
                  index_arg=True),
        FieldSpec("proc.apid", N, _ancestor_field(lambda p: p.pid), OPT, index_arg=True),
        FieldSpec("proc.acmdline", S, _ancestor_field(lambda p: p.cmdline), OPT, index_arg=True),
        FieldSpec("proc.aexe", S, _ancestor_field(lambda p: p.exe), OPT, index_arg=True),
        FieldSpec("proc.aexepath", S, _ancestor_field(lambda p: p.exepath), OPT, index_arg=True),
        FieldSpec("proc.duration", REL, _plain(lambda e: _duration(e.proc, e))),
        FieldSpec("proc.ppid.duration", REL, _plain(lambda e: _duration(e.proc.parent, e))),
        FieldSpec("proc.pid.ts", ABS, _plain(lambda e: e.proc.start_ts or None)),
        FieldSpec("proc.ppid.ts", ABS, _parent(lambda p: p.start_ts or None)),
        FieldSpec("proc.sid", N, _plain(lambda e: e.proc.sid)),
        FieldSpec("proc.sname", S, _leader_field("sid", name)),
        FieldSpec("proc.sid.exe", S, _leader_field("sid", lambda p: p.exe)),
        FieldSpec("proc.sid.exepath", S, _leader_field("sid", lambda p: p.exepath)),
        FieldSpec("proc.is_sid_leader", B, _plain(lambda e: e.proc.sid == e.proc.pid)),
        FieldSpec("proc.vpgid", N, _plain(lambda e: e.proc.vpgid)),
        FieldSpec("proc.vpgid.name", S, _leader_field("vpgid", name)),
        FieldSpec("proc.vpgid.exe", S, _leader_field("vpgid", lambda p: p.exe)),
        FieldSpec("proc.vpgid.exepath", S, _leader_field("vpgid", lambda p: p.exepath)),
        FieldSpec("proc.is_vpgid_leader", B, _plain(_is_vpgid_leader)),
        FieldSpec("proc.is_exe_writable", B, _plain(lambda e: e.proc.is_exe_writable)),
        FieldSpec("proc.is_exe_upper_layer", B, _plain(lambda e: e.proc.is_exe_upper_layer)),
        FieldSpec("proc.is_exe_from_memfd", B, _plain(lambda e: e.proc.is_exe_from_memfd)),
        FieldSpec("proc.exe_ino", N, _plain(lambda e: e.proc.exe_ino)),
        FieldSpec("proc.exe_ino.ctime", ABS, _plain(lambda e: e.proc.exe_ino_ctime)),
        FieldSpec("proc.exe_ino.mtime", ABS, _plain(lambda e: e.proc.exe_ino_mtime)),
        FieldSpec("proc.exe_ino.ctime_duration_proc_start", REL, _plain(_ctime_to_start)),
        FieldSpec("proc.env", S, _env, OPT, "environment, or one variable: proc.env[HOME]"),
        FieldSpec("proc.is_container_healthcheck", B, _plain(lambda e: False)),
        FieldSpec("proc.is_container_liveness_probe", B, _plain(lambda e: False)),
        FieldSpec("proc.is_container_readiness_probe", B, _plain(lambda e: False)),
        FieldSpec("thread.tid", N, _plain(lambda e: e.tid)),
        FieldSpec("thread.vtid", N, _plain(lambda e: e.extra.get("vtid"))),
        FieldSpec("thread.ismain", B, _plain(lambda e: e.tid == e.pid)),
        FieldSpec("thread.cap_effective", S, _plain(lambda e: _caps(e.proc.cap_effective))),
        FieldSpec("thread.cap_permitted", S, _plain(lambda e: _caps(e.proc.cap_permitted))),
    ]  # fmt: skip


_caps = fl.capabilities


def _dir_slash(path: str) -> str | None:
    # Falco's proc.cwd ends with a slash ("/dev/shm/"), which upstream rules rely on.
    if not path:
        return None
    return path if path.endswith("/") else path + "/"


def _is_vpgid_leader(e: Event) -> bool | None:
    p = e.proc
    return None if p.vpgid is None or p.vpid is None else p.vpgid == p.vpid


def _loginshellid(e: Event) -> int | None:
    """pid of the eldest shell ancestor (Falco's proc.loginshellid)."""
    shells = {"ash", "bash", "csh", "ksh", "sh", "tcsh", "zsh", "dash"}
    found = None
    for p in _chain(e):
        if p.name in shells:
            found = p.pid
    return found


def _ctime_to_start(e: Event) -> int | None:
    p = e.proc
    start_wall = e.extra.get("proc_start_wall_ns")
    if p.exe_ino_ctime is None or start_wall is None:
        return None
    return max(0, start_wall - p.exe_ino_ctime)


# ---------------------------------------------------------------- fd.*


def _fd(get: Callable[[FdInfo], Any]) -> Extractor:
    def ext(e: Event, _a: Arg) -> Any:
        return None if e.fd is None else get(e.fd)

    return ext


def _is_file(f: FdInfo) -> bool:
    return f.type in ("file", "directory")


def _client(f: FdInfo) -> tuple[str | None, int | None]:
    return (f.rip, f.rport) if f.is_server else (f.lip, f.lport)


def _server(f: FdInfo) -> tuple[str | None, int | None]:
    return (f.lip, f.lport) if f.is_server else (f.rip, f.rport)


def _sock(get: Callable[[FdInfo], Any]) -> Extractor:
    return _fd(lambda f: get(f) if f.sockfamily == "ip" else None)


def _both(get: Callable[[FdInfo], tuple[Any, Any]]) -> Extractor:
    """Filter-only fields that match either end (fd.ip, fd.port, fd.net)."""

    def ext(e: Event, _a: Arg) -> list[Any] | None:
        f = e.fd
        if f is None or f.sockfamily != "ip":
            return None
        return [v for v in get(f) if v is not None]

    return ext


def _fd_types(e: Event, a: Arg) -> Any:
    fds = e.proc.fds
    if a is None or a == "":
        return sorted({f.type for f in fds.values()})
    f = fds.get(int(a))
    return None if f is None else f.type


def _fd_directory(f: FdInfo) -> str | None:
    if not _is_file(f) or not f.name:
        return None
    if f.type == "directory":
        return f.name
    return os.path.dirname(f.name) or "/"


def _fd_filename(f: FdInfo) -> str | None:
    if f.type != "file" or not f.name:
        return None
    return os.path.basename(f.name)


def _fd_fields() -> list[FieldSpec]:
    return [
        FieldSpec("fd.num", N, _fd(lambda f: f.num)),
        FieldSpec("fd.type", S, _fd(lambda f: f.type)),
        FieldSpec("fd.typechar", S, _fd(lambda f: f.typechar)),
        FieldSpec("fd.name", S, _fd(lambda f: f.name or None)),
        FieldSpec("fd.nameraw", S, _fd(lambda f: f.nameraw or f.name or None)),
        FieldSpec("fd.directory", S, _fd(_fd_directory)),
        FieldSpec("fd.filename", S, _fd(_fd_filename)),
        FieldSpec("fd.containername", S, _plain(_containername)),
        FieldSpec("fd.containerdirectory", S, _plain(_containerdirectory)),
        FieldSpec("fd.ino", N, _fd(lambda f: f.ino)),
        FieldSpec("fd.uid", S, lambda e, _a: None if e.fd is None else f"{e.tid}{e.fd.num}"),
        FieldSpec("fd.ip", IP, _both(lambda f: (f.lip, f.rip)), both_ends=True),
        FieldSpec("fd.port", PORT, _both(lambda f: (f.lport, f.rport)), both_ends=True),
        FieldSpec("fd.net", NET, _both(lambda f: (f.lip, f.rip)), both_ends=True),
        FieldSpec("fd.proto", S, _both(lambda f: (f.l4proto, f.l4proto)), both_ends=True),
        FieldSpec("fd.cip", IP, _sock(lambda f: _client(f)[0])),
        FieldSpec("fd.sip", IP, _sock(lambda f: _server(f)[0])),
        FieldSpec("fd.lip", IP, _sock(lambda f: f.lip)),
        FieldSpec("fd.rip", IP, _sock(lambda f: f.rip)),
        FieldSpec("fd.cnet", NET, _sock(lambda f: _client(f)[0])),
        FieldSpec("fd.snet", NET, _sock(lambda f: _server(f)[0])),
        FieldSpec("fd.lnet", NET, _sock(lambda f: f.lip)),
        FieldSpec("fd.rnet", NET, _sock(lambda f: f.rip)),
        FieldSpec("fd.cport", PORT, _sock(lambda f: _client(f)[1])),
        FieldSpec("fd.sport", PORT, _sock(lambda f: _server(f)[1])),
        FieldSpec("fd.lport", PORT, _sock(lambda f: f.lport)),
        FieldSpec("fd.rport", PORT, _sock(lambda f: f.rport)),
        FieldSpec("fd.cproto", S, _sock(lambda f: f.l4proto)),
        FieldSpec("fd.sproto", S, _sock(lambda f: f.l4proto)),
        FieldSpec("fd.lproto", S, _sock(lambda f: f.l4proto)),
        FieldSpec("fd.rproto", S, _sock(lambda f: f.l4proto)),
        FieldSpec("fd.l4proto", S, _fd(lambda f: f.l4proto)),
        FieldSpec("fd.sockfamily", S, _fd(lambda f: f.sockfamily)),
        FieldSpec("fd.is_server", B, _fd(lambda f: f.is_server)),
        FieldSpec("fd.connected", B, _fd(lambda f: f.connected)),
        FieldSpec("fd.name_changed", B, _fd(lambda f: f.name_changed)),
        # No DNS: Falco resolves these only for domains it was told to watch.
        FieldSpec("fd.cip.name", S, _fd(lambda f: None)),
        FieldSpec("fd.sip.name", S, _fd(lambda f: None)),
        FieldSpec("fd.lip.name", S, _fd(lambda f: None)),
        FieldSpec("fd.rip.name", S, _fd(lambda f: None)),
        FieldSpec("fd.types", S, _fd_types, OPT, "fd types of the process; [N] for fd N",
                  index_arg=True),
    ]  # fmt: skip


def _containername(e: Event) -> str | None:
    return None if e.fd is None else f"{e.container_id}:{e.fd.name}"


def _containerdirectory(e: Event) -> str | None:
    d = _fd_directory(e.fd) if e.fd else None
    return None if d is None else f"{e.container_id}:{d}"


# ---------------------------------------------------------------- user.* / group.*


def _user_fields() -> list[FieldSpec]:
    u = lambda get: _plain(lambda e: None if e.user is None else get(e.user))  # noqa: E731
    g = lambda get: _plain(lambda e: None if e.group is None else get(e.group))  # noqa: E731
    return [
        FieldSpec("user.uid", N, u(lambda x: x.uid)),
        FieldSpec("user.name", S, u(lambda x: x.name)),
        FieldSpec("user.homedir", S, u(lambda x: x.homedir)),
        FieldSpec("user.shell", S, u(lambda x: x.shell)),
        FieldSpec("user.loginuid", N, u(lambda x: x.loginuid)),
        FieldSpec("user.loginname", S, u(lambda x: x.loginname)),
        FieldSpec("group.gid", N, g(lambda x: x.gid)),
        FieldSpec("group.name", S, g(lambda x: x.name)),
    ]


# ---------------------------------------------------------------- container.* / k8s.*


def _image_parts(image: str) -> tuple[str, str | None, str | None]:
    """``registry/repo:tag@sha256:...`` -> (repository, tag, digest)."""
    digest = None
    if "@" in image:
        image, digest = image.split("@", 1)
    tag = None
    slash = image.rfind("/")
    colon = image.rfind(":")
    if colon > slash:
        image, tag = image[:colon], image[colon + 1 :]
    return image, tag, digest


def _c(get: Callable[[Any], Any], host: Any = None) -> Extractor:
    def ext(e: Event, _a: Arg) -> Any:
        return host if e.container is None else get(e.container)

    return ext


def _label(e: Event, a: Arg) -> Any:
    if e.container is None:
        return None
    if a is None:
        return ", ".join(f"{k}:{v}" for k, v in e.container.labels.items())
    return e.container.labels.get(str(a))


def _container_fields() -> list[FieldSpec]:
    return [
        FieldSpec("container.id", S, _plain(lambda e: e.container_id)),
        FieldSpec("container.full_id", S, _c(lambda c: c.full_id, HOST_CONTAINER_ID)),
        FieldSpec("container.name", S, _c(lambda c: c.name or c.full_id[:12], HOST_CONTAINER_ID)),
        FieldSpec("container.image", S, _c(lambda c: c.image or None)),
        FieldSpec("container.image.repository", S, _c(lambda c: _image_parts(c.image)[0] or None)),
        FieldSpec("container.image.tag", S, _c(lambda c: _image_parts(c.image)[1])),
        FieldSpec("container.image.digest", S, _c(lambda c: _image_parts(c.image)[2])),
        FieldSpec("container.image.id", S, _c(lambda c: _image_parts(c.image)[2])),
        FieldSpec("container.type", S, _c(lambda c: "containerd")),
        FieldSpec("container.privileged", B, _c(lambda c: c.privileged)),
        FieldSpec(
            "container.mounts", S, _c(lambda c: " ".join(m.falco_text() for m in c.mounts) or None)
        ),
        FieldSpec(
            "container.mount",
            S,
            _mount_field(MountInfo.falco_text, "none"),
            REQ,
            "one mount by index or source glob: source:dest:mode:rdonly:propagation",
        ),
        FieldSpec(
            "container.mount.source",
            S,
            _mount_field(lambda m: m.source, by="dest"),
            REQ,
            "a mount's source, by index or destination glob",
        ),
        FieldSpec(
            "container.mount.dest",
            S,
            _mount_field(lambda m: m.dest),
            REQ,
            "a mount's destination, by index or source glob",
        ),
        FieldSpec("container.mount.mode", S, _mount_field(lambda m: m.mode), REQ),
        FieldSpec("container.mount.rdonly", B, _mount_field(lambda m: m.rdonly), REQ),
        FieldSpec("container.mount.propagation", S, _mount_field(lambda m: m.propagation), REQ),
        FieldSpec("container.start_ts", ABS, _c(lambda c: c.start_ts)),
        FieldSpec("container.duration", REL, _plain(_container_duration)),
        FieldSpec("container.label", S, _label, OPT, "container label by key"),
        FieldSpec("container.labels", S, _label),
        FieldSpec("container.healthcheck", S, _c(lambda c: None)),
        FieldSpec("container.liveness_probe", S, _c(lambda c: None)),
        FieldSpec("container.readiness_probe", S, _c(lambda c: None)),
        FieldSpec("container.host_pid", B, _c(lambda c: False)),
        FieldSpec("container.host_network", B, _c(lambda c: False)),
        FieldSpec("container.host_ipc", B, _c(lambda c: False)),
    ]


def _find_mount(mounts: list[MountInfo], a: Arg, by: str) -> MountInfo | None:
    """By index (``[0]``) or by the first mount whose ``by`` path matches a glob."""
    if isinstance(a, int):
        return mounts[a] if 0 <= a < len(mounts) else None
    pattern = str(a)
    return next((m for m in mounts if fnmatch.fnmatchcase(getattr(m, by), pattern)), None)


def _mount_field(
    get: Callable[[MountInfo], Any], missing: Any = None, by: str = "source"
) -> Extractor:
    def ext(e: Event, a: Arg) -> Any:
        if e.container is None:
            return None
        mount = _find_mount(e.container.mounts, a, by)
        return missing if mount is None else get(mount)

    return ext


def _container_duration(e: Event) -> int | None:
    c = e.container
    if c is None or c.start_ts is None or not e.wall_ns:
        return None
    return max(0, e.wall_ns - c.start_ts)


_K8S = [
    "k8s.ns.name", "k8s.ns.id", "k8s.pod.name", "k8s.pod.id", "k8s.pod.uid",
    "k8s.pod.sandbox_id", "k8s.pod.full_sandbox_id", "k8s.pod.ip", "k8s.pod.cni.json",
    "k8s.pod.labels", "k8s.rc.name", "k8s.rs.name", "k8s.svc.name", "k8s.deployment.name",
]  # fmt: skip
_K8S_KEYED = ["k8s.pod.label", "k8s.ns.label"]


def _k8s_fields() -> list[FieldSpec]:
    none: Extractor = lambda e, a: None  # noqa: E731
    specs = [FieldSpec(n, S, none, description="no Kubernetes here") for n in _K8S]
    specs += [FieldSpec(n, S, none, REQ, "no Kubernetes here") for n in _K8S_KEYED]
    return specs


# libsinsp's syscall fields this sensor cannot serve (it does not see the data):
# a rule naming one is refused like an unknown field, by name.
UNSERVED_FIELDS = frozenset({
    "thread.cpu", "thread.cpu.user", "thread.cpu.system", "thread.exectime",
    "thread.totexectime", "thread.vmsize", "thread.vmrss", "thread.pfmajor", "thread.pfminor",
    "thread.cgroups", "thread.cgroup", "thread.nametid", "thread.cap_inheritable",
    "proc.vmsize", "proc.vmrss", "proc.vmswap", "proc.pfmajor", "proc.pfminor",
    "proc.fdopencount", "proc.fdlimit", "proc.fdusage", "proc.nthreads", "proc.nchilds",
    "proc.stdin.type", "proc.stdout.type", "proc.stderr.type", "proc.stdin.name",
    "proc.stdout.name", "proc.stderr.name", "proc.pidns_init_start_ts",
    "fd.dev", "fd.dev.major", "fd.dev.minor",
    "evt.deltatime", "evt.deltatime.s", "evt.deltatime.ns", "evt.outputtime", "evt.around",
    "evt.count.error", "evt.count.error.file", "evt.count.error.net", "evt.count.error.memory",
    "evt.count.error.other", "evt.count.exit", "evt.category", "evt.asynctype",
    "container.ip", "container.cni.json",
})  # fmt: skip


def all_specs() -> list[FieldSpec]:
    return (
        _fs_path_fields()
        + _evt_fields()
        + _proc_fields()
        + _fd_fields()
        + _user_fields()
        + _container_fields()
        + _k8s_fields()
    )


def default_registry() -> FieldRegistry:
    """Every syscall field the built-in sensor can supply."""
    return FieldRegistry(all_specs(), unserved=UNSERVED_FIELDS)
