"""bpftrace JSON lines -> ``Event``: decoding, exec assembly, fd tracking.

``binparser.BinaryParser`` (the compiled backend's records) is a subclass:
it turns each binary record into the list a JSON record holds and shares
everything from ``record`` on."""

from __future__ import annotations

import ipaddress
import os
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from policies.falco.event import ContainerInfo, Event, FdInfo, GroupInfo, Process, UserInfo
from policies.sensor import flags as fl
from policies.sensor import program as pg
from policies.sensor.cgroups import CgroupMap
from policies.sensor.proctable import ProcessTable, exe_in_upper_layer
from sandbox import userns

EINPROGRESS = 115
HDR = 8  # (code, nsecs, tid, pid, cgid, uid, gid, comm)
# Arguments printed from 32-bit signed tracepoint fields, widened unsigned by bpftrace.
SIGNED32 = frozenset({"dirfd", "fd", "olddir", "newdir", "linkdirfd", "olddirfd", "newdirfd",
                      "oldfd", "newfd", "pid", "uid", "gid", "res", "sig"})  # fmt: skip
OPENS = frozenset({"open", "openat", "openat2", "creat"})
SOCK_TYPES = {fl.ADDRESS_FAMILIES.get(k): v for k, v in
              {2: "ipv4", 10: "ipv6", 1: "unix", 16: "netlink"}.items()}  # fmt: skip
L4 = {1: "tcp", 2: "udp", 3: "raw", 5: "tcp"}


def signed32(v: int) -> int:
    return v - (1 << 32) if (1 << 31) <= v < (1 << 32) else v


def decode_buf(s: str) -> bytes:
    """bpftrace prints buf() bytes as ``\\xNN`` escapes, printable bytes as-is."""
    out = bytearray()
    i, n = 0, len(s)
    while i < n:
        if s[i] == "\\" and i + 3 < n + 1 and s[i + 1 : i + 2] == "x":
            out.append(int(s[i + 2 : i + 4], 16))
            i += 4
        else:
            out += s[i].encode("latin-1", "replace")
            i += 1
    return bytes(out)


@dataclass(slots=True)
class SockAddr:
    family: int
    ip: str | None = None
    port: int | None = None
    path: str | None = None


def decode_sockaddr(raw: bytes) -> SockAddr | None:
    if len(raw) < 2:
        return None
    family = int.from_bytes(raw[:2], "little")
    if family == socket.AF_INET and len(raw) >= 8:
        return SockAddr(family, str(ipaddress.IPv4Address(raw[4:8])), int.from_bytes(raw[2:4]))
    if family == socket.AF_INET6 and len(raw) >= 24:
        ip6 = ipaddress.IPv6Address(raw[8:24])
        ip = str(ip6.ipv4_mapped) if ip6.ipv4_mapped else str(ip6)
        return SockAddr(family, ip, int.from_bytes(raw[2:4]))
    if family == socket.AF_UNIX:
        body = raw[2:]
        if body[:1] == b"\0":  # abstract socket
            return SockAddr(
                family, path="@" + body[1:].split(b"\0", 1)[0].decode("utf-8", "replace")
            )
        return SockAddr(family, path=body.split(b"\0", 1)[0].decode("utf-8", "replace"))
    return SockAddr(family)


def _tuple_name(f: FdInfo) -> str:
    if f.sockfamily == "unix":
        return f.name
    cip, cport, sip, sport = (
        (f.rip, f.rport, f.lip, f.lport) if f.is_server else (f.lip, f.lport, f.rip, f.rport)
    )
    return f"{cip or '0.0.0.0'}:{cport or 0}->{sip or '0.0.0.0'}:{sport or 0}"


@dataclass(slots=True)
class _PendingExec:
    filename: str
    argv: list[str] = field(default_factory=list)


@dataclass(slots=True)
class ParserStats:
    records: int = 0
    events: int = 0
    lost: int = 0  # bpftrace "lost events" (perf buffer full)
    bad_lines: int = 0
    prefiltered: int = 0  # no rule could match: dropped before /proc reads


class Parser:
    """Feeds on bpftrace ``-f json`` lines; yields merged ``Event`` objects."""

    def __init__(
        self,
        cgroups: CgroupMap,
        table: ProcessTable | None = None,
        event_types: Iterable[str] | None = None,
        prefilter: Callable[[Event], bool] | None = None,
    ) -> None:
        self.cgroups = cgroups
        self.table = table or ProcessTable()
        self.wanted = frozenset(event_types) if event_types is not None else None
        # False for an event no rule can match: dropped before /proc is read for it.
        self.prefilter = prefilter
        self.stats = ParserStats()
        self._execs: dict[int, _PendingExec] = {}
        self._strs: dict[int, dict[int, Any]] = {}  # tid -> arg index -> string or bytes
        self._inos: dict[int, list[int]] = {}  # tid -> exe inode, ctime, mtime
        # Strings cut in the kernel, bit i for argument i; -1: judge by length
        # (bpftrace's records say nothing). The binary reader sets it per record.
        self._cut = -1
        self._num = 0
        self._wall_offset = time.time_ns() - time.monotonic_ns()
        self._hostname = socket.gethostname()
        self._users: dict[tuple[str | None, int, int], UserInfo] = {}
        self._id_maps: dict[str, tuple[userns.IdMapping, userns.IdMapping]] = {}
        self._upper: dict[str, bool] = {}

    # ------------------------------------------------------------ lines

    def feed(self, line: str | bytes) -> Event | None:
        try:
            msg = orjson.loads(line)  # ~5x json's speed; every record passes here
        except ValueError:
            self.stats.bad_lines += 1
            return None
        kind = msg.get("type") if isinstance(msg, dict) else None
        if kind == "value" and isinstance(msg.get("data"), list):
            self.stats.records += 1
            try:
                evt = self.record(msg["data"])
            except (IndexError, TypeError, ValueError, KeyError):
                self.stats.bad_lines += 1
                return None
            if evt is not None and (self.wanted is None or evt.type in self.wanted):
                return self._pass(evt)
            return None
        if kind == "lost_events":
            self.stats.lost += int(msg.get("data", {}).get("events", 0))
        return None

    def forget_container(self, full_id: str) -> None:
        self.table.forget_container(full_id)
        self._users = {k: v for k, v in self._users.items() if k[0] != full_id}

    def _pass(self, evt: Event) -> Event | None:
        if self.prefilter is not None and not self.prefilter(evt):
            self.stats.prefiltered += 1
            return None
        if self.table.complete(evt.proc):
            self._complete_exe(evt.proc)
        self.stats.events += 1
        return evt

    def record(self, d: list[Any]) -> Event | None:
        code = d[0]
        if code == pg.REC_ARGV:
            pending = self._execs.get(d[1])
            if pending is not None and d[2] == len(pending.argv):
                pending.argv.append(d[3])
            return None
        if code == pg.REC_STR:
            self._strs.setdefault(d[1], {})[d[2]] = d[3]
            return None
        if code == pg.REC_EXE_INO:
            self._inos[d[1]] = d[2:7]
            return None
        if code == pg.REC_SYSCALL:
            return self._syscall(d)
        if code == pg.REC_EXEC_ENTER:
            self._execs[d[2]] = _PendingExec(self._strs.pop(d[2], {}).get(0, ""))
            return None
        if code == pg.REC_EXEC_EXIT:
            return self._exec_exit(d)
        if code == pg.REC_FORK:
            return self._fork(d)
        if code == pg.REC_EXIT:
            return self._exit(d)
        return None

    # ------------------------------------------------------------ common

    def _base(self, d: list[Any], etype: str, *, fresh: bool = False) -> Event:
        ts, tid, pid, cgid, uid, gid, comm = d[1:HDR]
        proc = self.table.lookup(pid, tid, comm, ts, fresh=fresh)
        container = self.cgroups.container(cgid, pid)
        cid = container.full_id if container else None
        proc.container_id = proc.container_id or cid
        uid, gid = self._inside_ids(cid, pid, uid, gid)
        if (proc.uid, proc.gid) != (uid, gid):
            if proc.uid != -1 and not fresh:  # setuid: earlier events keep the old ids
                proc = self.table.successor(proc)
            proc.uid, proc.gid = uid, gid
        self._num += 1
        return Event(
            type=etype, dir="<", ts_ns=ts, tid=tid, pid=pid, proc=proc, container=container,
            user=self._user(proc, uid, cid), group=self._group(proc, gid, cid),
            num=self._num, wall_ns=ts + self._wall_offset, hostname=self._hostname,
        )  # fmt: skip

    def _inside_ids(self, cid: str | None, pid: int, uid: int, gid: int) -> tuple[int, int]:
        """uid and gid as the sandbox sees them, as Falco reports a container's user.

        A user-namespaced sandbox's root is an unprivileged host uid (sandbox.userns);
        its /etc/passwd and the rules speak of 0. One /proc read per sandbox.
        """
        if cid is None:
            return uid, gid
        maps = self._id_maps.get(cid)
        if maps is None:
            maps = userns.read_mappings(pid)
            if maps is None:  # gone already: report what the kernel said
                return uid, gid
            self._id_maps[cid] = maps
        return userns.id_inside(maps[0], uid), userns.id_inside(maps[1], gid)

    def _user(self, proc: Process, uid: int, cid: str | None) -> UserInfo:
        key = (cid, uid, proc.loginuid)
        u = self._users.get(key)
        if u is None or u.name is None:
            u = self._users[key] = self.table.user(proc, uid, cid)
        return u

    def _group(self, proc: Process, gid: int, cid: str | None) -> GroupInfo:
        return self.table.group(proc, gid, cid)

    # ------------------------------------------------------------ syscalls

    def _syscall(self, d: list[Any]) -> Event | None:
        name = pg.NAMES[d[HDR]]
        evt = self._base(d, name)
        evt.res = signed32(d[HDR + 1])
        evt.args = self._args(name, d[HDR + 2 :], self._strs.pop(evt.tid, {}), self._cut)
        handler = _HANDLERS.get(name)
        if handler is not None:
            handler(self, evt)
        elif isinstance(evt.args.get("fd"), int):
            evt.fd = evt.proc.fds.get(evt.args["fd"])
        return evt

    @staticmethod
    def _args(name: str, values: list[Any], strs: dict[int, Any], cut: int = -1) -> dict[str, Any]:
        """``strs``: argument index -> string, or a sockaddr's bytes (as bytes from
        the binary records, as bpftrace's escaped text from its JSON)."""
        args: dict[str, Any] = {}
        vals = iter(values)
        for i, spec in enumerate(pg.SYSCALLS[name][: pg.N_ARG_MAPS]):
            v = next(vals)
            if spec.kind == pg.STR:
                v = strs.get(i, "")
                if (len(v) >= pg.STRLEN - 1) if cut < 0 else (cut >> i) & 1:
                    args["_truncated"] = True  # cut in the kernel: do not trust a match
                args[spec.falco] = v
            elif spec.kind == pg.HOW:
                args["flags"], args["mode"] = v, next(vals)
            elif spec.kind in (pg.SOCKADDR, pg.PEER):
                raw = strs.get(i)
                data = raw if isinstance(raw, bytes) else decode_buf(raw) if raw else b""
                args[spec.falco] = decode_sockaddr(data) if data else None
            elif spec.falco in SIGNED32 and isinstance(v, int):
                args[spec.falco] = signed32(v)
            else:
                args[spec.falco] = v
        return args

    def _open(self, evt: Event) -> None:
        raw = evt.args.get("name", "")
        base = None
        dirfd = evt.args.get("dirfd", fl.AT_FDCWD)
        if dirfd != fl.AT_FDCWD and not raw.startswith("/"):
            dfd = evt.proc.fds.get(dirfd)
            base = dfd.name if dfd else None
        flags = evt.args.get("flags", 0) if evt.type != "creat" else 0o1101
        ftype = "directory" if flags & fl.O_DIRECTORY else "file"
        res = evt.res if evt.res is not None else -1
        name = fl.resolve_path(raw, evt.proc.cwd, base)
        fd = FdInfo(num=max(res, -1), type=ftype, name=name, nameraw=raw, flags=flags)
        evt.fd = fd
        if res >= 0:
            evt.proc.fds[res] = fd

    def _socket(self, evt: Event) -> None:
        if evt.res is None or evt.res < 0:
            return
        fam = fl.address_family(evt.args.get("domain", 0))
        ftype = SOCK_TYPES.get(fam, "socket")
        is_ip = ftype in ("ipv4", "ipv6")
        l4 = L4.get(evt.args.get("type", 0) & 0xF) if is_ip else None
        fd = FdInfo(num=evt.res, type=ftype, sockfamily=_sockfamily(ftype), l4proto=l4)
        evt.proc.fds[evt.res] = fd
        evt.fd = fd

    def _sock_fd(self, evt: Event, num: int, addr: SockAddr | None) -> FdInfo:
        fd = evt.proc.fds.get(num)
        if fd is None:
            ftype = _fd_type_of(addr)
            fd = FdInfo(num=num, type=ftype, sockfamily=_sockfamily(ftype),
                        l4proto="tcp" if ftype in ("ipv4", "ipv6") else None)  # fmt: skip
            if num >= 0:
                evt.proc.fds[num] = fd
        return fd

    def _connect(self, evt: Event) -> None:
        addr = evt.args.get("addr")
        fd = self._sock_fd(evt, evt.args.get("fd", -1), addr)
        if isinstance(addr, SockAddr):
            if addr.path is not None:
                fd.name = addr.path
            else:
                fd.rip, fd.rport = addr.ip, addr.port
            fd.is_server = False
            evt.args["addr"] = _render_addr(addr)
        fd.connected = evt.res == 0 or evt.res == -EINPROGRESS
        if fd.sockfamily == "ip":
            fd.name = _tuple_name(fd)
        evt.args["tuple"] = fd.name
        evt.fd = fd

    def _bind(self, evt: Event) -> None:
        addr = evt.args.get("addr")
        fd = self._sock_fd(evt, evt.args.get("fd", -1), addr)
        if isinstance(addr, SockAddr):
            if addr.path is not None:
                fd.name = addr.path
            else:
                fd.lip, fd.lport = addr.ip, addr.port
            evt.args["addr"] = _render_addr(addr)
        evt.fd = fd

    def _listen(self, evt: Event) -> None:
        fd = evt.proc.fds.get(evt.args.get("fd", -1))
        if fd is not None:
            fd.is_server = True
        evt.fd = fd

    def _accept(self, evt: Event) -> None:
        peer = evt.args.get("tuple")
        lsock = evt.proc.fds.get(evt.args.get("fd", -1))
        if evt.res is None or evt.res < 0:
            evt.fd = lsock
            return
        ftype = lsock.type if lsock else _fd_type_of(peer)
        fd = FdInfo(num=evt.res, type=ftype, sockfamily=_sockfamily(ftype),
                    l4proto=lsock.l4proto if lsock else "tcp", is_server=True,
                    connected=True)  # fmt: skip
        if lsock is not None:
            fd.lip, fd.lport = lsock.lip, lsock.lport
            fd.name = lsock.name if ftype == "unix" else ""
        if isinstance(peer, SockAddr) and peer.ip is not None:
            fd.rip, fd.rport = peer.ip, peer.port
        if fd.sockfamily == "ip":
            fd.name = _tuple_name(fd)
        evt.args["tuple"] = fd.name
        evt.proc.fds[evt.res] = fd
        evt.fd = fd

    def _sendto(self, evt: Event) -> None:
        addr = evt.args.get("tuple")
        fd = evt.proc.fds.get(evt.args.get("fd", -1))
        if fd is not None and isinstance(addr, SockAddr) and addr.ip is not None:
            fd.name_changed = (fd.rip, fd.rport) != (addr.ip, addr.port)
            fd.rip, fd.rport = addr.ip, addr.port
            fd.name = _tuple_name(fd)
        if isinstance(addr, SockAddr):
            evt.args["tuple"] = _render_addr(addr)
        evt.fd = fd

    def _dup(self, evt: Event) -> None:
        old = evt.args.get("oldfd", evt.args.get("fd", -1))
        fd = evt.proc.fds.get(old)
        evt.fd = fd
        if fd is not None and evt.res is not None and evt.res >= 0:
            copy = FdInfo(**{k: getattr(fd, k) for k in FdInfo.__slots__})  # type: ignore[attr-defined]
            copy.num = evt.res
            evt.proc.fds[evt.res] = copy

    def _close(self, evt: Event) -> None:
        evt.fd = evt.proc.fds.pop(evt.args.get("fd", -1), None)

    def _chdir(self, evt: Event) -> None:
        if evt.res == 0:
            cwd = fl.resolve_path(evt.args.get("path", ""), evt.proc.cwd)
            self._set_cwd(evt, cwd)

    def _fchdir(self, evt: Event) -> None:
        fd = evt.proc.fds.get(evt.args.get("fd", -1))
        evt.fd = fd
        if evt.res == 0 and fd is not None:
            self._set_cwd(evt, fd.name)

    def _set_cwd(self, evt: Event, cwd: str) -> None:
        # The event and those before it keep the directory they ran in.
        if cwd != evt.proc.cwd:
            self.table.successor(evt.proc).cwd = cwd

    # ------------------------------------------------------------ process records

    def _exec_exit(self, d: list[Any]) -> Event:
        name = pg.NAMES[d[HDR]]
        pending = self._execs.pop(d[2], None)
        exe_name = self._strs.pop(d[2], {}).get(0, "")
        res = signed32(d[HDR + 1])
        # A successful exec makes a new process object: events before it keep the old.
        evt = self._base(d, name, fresh=res == 0)
        evt.res = res
        filename = pending.filename if pending else ""
        evt.args = {"filename": filename}
        if evt.res == 0:
            ino: list[Any] = self._inos.pop(d[2], [None, 0, 0, 0, 0])
            kernel = [*d[HDR + 2 : HDR + 8], exe_name, *ino]
            self._apply_exec(evt, kernel, filename, pending.argv if pending else None)
        return evt

    def _apply_exec(self, evt: Event, k: list[Any], filename: str, argv: list[str] | None) -> None:
        proc = evt.proc
        ppid, cap_eff, cap_prm, loginuid, tty_major, tty_minor, exe_name = k[:7]
        ino, ctime_s, ctime_ns, mtime_s, mtime_ns = k[7:12]
        self.table.on_exec(proc, filename, argv)
        proc.ppid = ppid or proc.ppid
        if proc.parent is None or proc.parent.pid != proc.ppid:
            proc.parent = self.table.procs.get(proc.ppid, proc.parent)
        proc.cap_effective, proc.cap_permitted = cap_eff, cap_prm
        proc.loginuid = signed32(loginuid)
        proc.tty = _encode_dev(tty_major, tty_minor) if tty_major else 0
        # No exe record (the rules need none): unknown, not "not from memfd".
        proc.is_exe_from_memfd = exe_name.startswith("memfd:") if ino is not None else None
        if proc.is_exe_from_memfd:
            proc.exepath = proc.exepath or exe_name
        proc.exe_ino = ino
        proc.exe_ino_ctime = ctime_s * 1_000_000_000 + ctime_ns if ino is not None else None
        proc.exe_ino_mtime = mtime_s * 1_000_000_000 + mtime_ns if ino is not None else None
        evt.args.update({"exe": proc.exe, "args": " ".join(proc.args), "cwd": proc.cwd})
        evt.extra["proc_start_wall_ns"] = (
            proc.start_ts + self._wall_offset if proc.start_ts else None
        )

    def _complete_exe(self, proc: Process) -> None:
        proc.is_exe_upper_layer = self._upper_layer(proc)
        proc.is_exe_writable = _writable(proc)

    def _upper_layer(self, proc: Process) -> bool | None:
        if proc.container_id is None or not proc.exepath:
            return None
        return exe_in_upper_layer(self.table.proc_root, proc.pid, proc.exepath)

    def _fork(self, d: list[Any]) -> Event | None:
        # The parent's name first (busybox renames itself after exec'ing
        # /proc/self/exe): the child starts as the parent is at the fork.
        self.table.note_name(d[3], d[2], d[7])
        self.table.on_fork(d[3], d[HDR], d[1])
        if self.wanted is not None and "clone" not in self.wanted:
            return None
        evt = self._base(d, "clone")
        evt.res = d[HDR]
        return evt

    def _exit(self, d: list[Any]) -> Event | None:
        tid, pid = d[2], d[3]
        self._execs.pop(tid, None)
        evt = None
        if tid == pid and (self.wanted is None or "procexit" in self.wanted):
            evt = self._base(d, "procexit")
            evt.args = {"status": d[HDR]}
        self.table.on_exit(tid, pid)
        return evt


def _encode_dev(major: int, minor: int) -> int:
    # The kernel's new_encode_dev(), which Falco's proc.tty reports.
    return (minor & 0xFF) | (major << 8) | ((minor & ~0xFF) << 12)


def _writable(proc: Process) -> bool | None:
    try:
        st = os.stat(f"/proc/{proc.pid}/exe")
    except OSError:
        return None
    if proc.euid == 0:
        return True
    if st.st_uid == proc.euid:
        return bool(st.st_mode & 0o200)
    return bool(st.st_mode & 0o002) or (st.st_gid == proc.gid and bool(st.st_mode & 0o020))


def _sockfamily(ftype: str) -> str | None:
    return "ip" if ftype in ("ipv4", "ipv6") else "unix" if ftype == "unix" else None


def _fd_type_of(addr: Any) -> str:
    if isinstance(addr, SockAddr):
        types = {
            int(socket.AF_INET): "ipv4",
            int(socket.AF_INET6): "ipv6",
            int(socket.AF_UNIX): "unix",
        }
        return types.get(addr.family, "socket")
    return "ipv4"


def _render_addr(addr: SockAddr) -> str:
    if addr.path is not None:
        return addr.path
    return f"{addr.ip}:{addr.port}" if addr.ip else fl.address_family(addr.family)


_HANDLERS = {
    **{n: Parser._open for n in OPENS},
    "socket": Parser._socket,
    "connect": Parser._connect,
    "bind": Parser._bind,
    "listen": Parser._listen,
    "accept": Parser._accept,
    "accept4": Parser._accept,
    "sendto": Parser._sendto,
    "dup": Parser._dup,
    "dup2": Parser._dup,
    "dup3": Parser._dup,
    "close": Parser._close,
    "chdir": Parser._chdir,
    "fchdir": Parser._fchdir,
}

__all__ = ["ContainerInfo", "Parser", "ParserStats", "SockAddr", "decode_buf", "decode_sockaddr"]
