"""Process table: who is who inside the sandboxes.

Built from the sensor's fork/exec/exit records, completed from /proc/<pid>
for processes first seen mid-flight (started before the sensor, or whose
fork was lost). Parent links make proc.pname / proc.aname[N] cheap.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path

from policies.falco.event import GroupInfo, Process, UserInfo

MAX_PENDING_FORKS = 65536
LOGINUID_UNSET = 0xFFFFFFFF


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError:
        return None


def _readlink(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def _status_fields(pid: int) -> dict[str, str]:
    text = _read(f"/proc/{pid}/status") or ""
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


class ProcessTable:
    def __init__(self, proc_root: str = "/proc") -> None:
        self.procs: dict[int, Process] = {}
        # child tid -> (parent pid, fork ts); resolved when the child shows up as a process
        self._forks: OrderedDict[int, tuple[int, int]] = OrderedDict()
        self.proc_root = proc_root
        self._passwd: dict[str, dict[int, tuple[str, str, str]]] = {}
        self._group: dict[str, dict[int, str]] = {}
        # pids whose /proc details (vpid, caps, env...) were not read since their
        # exec: read only once one of their events is worth evaluating.
        self.stale: set[int] = set()

    # ------------------------------------------------------------ records

    def on_fork(self, parent_pid: int, child_tid: int, ts: int) -> None:
        self._forks[child_tid] = (parent_pid, ts)
        if len(self._forks) > MAX_PENDING_FORKS:
            self._forks.popitem(last=False)

    def on_exit(self, tid: int, pid: int) -> Process | None:
        self._forks.pop(tid, None)
        if tid != pid:
            return None
        self.stale.discard(pid)
        proc = self.procs.pop(pid, None)
        if proc is not None:
            proc.exited = True  # children keep their reference for the ancestry
        return proc

    def lookup(self, pid: int, tid: int, comm: str, ts: int) -> Process:
        proc = self.procs.get(pid)
        if proc is None:
            proc = self._new(pid, tid, comm, ts)
            self.procs[pid] = proc
        elif comm and proc.name != comm:
            proc.name = comm  # prctl(PR_SET_NAME) or exec
        return proc

    def _new(self, pid: int, tid: int, comm: str, ts: int) -> Process:
        fork = self._forks.pop(pid, None)
        parent = self.procs.get(fork[0]) if fork else None
        if parent is not None and fork is not None:
            if parent.pid in self.stale:
                self.stale.add(pid)
            return self._clone(parent, pid, comm, fork[1])
        return self.from_proc(pid, comm, ts)

    def _clone(self, parent: Process, pid: int, comm: str, ts: int) -> Process:
        # A forked child runs its parent's image until it execs.
        return Process(
            pid=pid, ppid=parent.pid, name=comm or parent.name, exe=parent.exe,
            exepath=parent.exepath, args=list(parent.args), cwd=parent.cwd, uid=parent.uid,
            gid=parent.gid, euid=parent.euid, loginuid=parent.loginuid, tty=parent.tty,
            vpgid=parent.vpgid, pgid=parent.pgid, sid=parent.sid, start_ts=ts,
            cap_effective=parent.cap_effective, cap_permitted=parent.cap_permitted,
            is_exe_writable=parent.is_exe_writable,
            is_exe_upper_layer=parent.is_exe_upper_layer,
            is_exe_from_memfd=parent.is_exe_from_memfd, exe_ino=parent.exe_ino,
            exe_ino_ctime=parent.exe_ino_ctime, exe_ino_mtime=parent.exe_ino_mtime,
            env=parent.env, parent=parent, container_id=parent.container_id,
            fds={n: f for n, f in parent.fds.items()},
        )  # fmt: skip

    def from_proc(self, pid: int, comm: str = "", ts: int = 0) -> Process:
        """Everything /proc still knows (the process may already be gone)."""
        proc = Process(pid=pid, name=comm, start_ts=ts)
        self.refresh(proc)
        if proc.ppid and proc.parent is None:
            parent = self.procs.get(proc.ppid)
            if parent is None and proc.ppid > 1:
                parent = self.from_proc(proc.ppid)
                self.procs[proc.ppid] = parent
            proc.parent = parent
        return proc

    def refresh(self, proc: Process) -> None:
        base = f"{self.proc_root}/{proc.pid}"
        st = _status_fields(proc.pid)
        # The event's comm comes from the kernel at the syscall; if /proc names
        # another program now, the process has exec'd since and /proc's cmdline
        # and exe describe that later program: keep what the event said.
        exec_since = bool(proc.name and st.get("Name") and st["Name"] != proc.name[:15])
        if not exec_since:
            cmdline = _read(f"{base}/cmdline")
            if cmdline:
                argv = cmdline.rstrip("\0").split("\0")
                proc.exe, proc.args = argv[0], argv[1:]
            proc.exepath = _readlink(f"{base}/exe") or proc.exepath
            if proc.exepath.endswith(" (deleted)"):
                proc.exepath = proc.exepath[: -len(" (deleted)")]
        proc.cwd = _readlink(f"{base}/cwd") or proc.cwd
        if st:
            self._apply_status(proc, st)
        login = _read(f"{base}/loginuid")
        if login and login.strip().isdigit():
            proc.loginuid = _signed32(int(login))
        stat = _read(f"{base}/stat")
        if stat:
            self._apply_stat(proc, stat)
        if proc.env is None:
            env = _read(f"{base}/environ")
            if env is not None:
                proc.env = dict(kv.split("=", 1) for kv in env.split("\0") if "=" in kv)

    @staticmethod
    def _apply_status(proc: Process, st: dict[str, str]) -> None:
        proc.name = proc.name or st.get("Name", "")
        if "PPid" in st:
            proc.ppid = int(st["PPid"])
        if "Uid" in st:
            uids = st["Uid"].split()
            proc.uid, proc.euid = int(uids[0]), int(uids[1])
        if "Gid" in st:
            proc.gid = int(st["Gid"].split()[0])
        if "NSpid" in st:
            proc.vpid = int(st["NSpid"].split()[-1])
        if "NSpgid" in st:
            proc.vpgid = int(st["NSpgid"].split()[-1])
        if "CapEff" in st:
            proc.cap_effective = int(st["CapEff"], 16)
        if "CapPrm" in st:
            proc.cap_permitted = int(st["CapPrm"], 16)

    @staticmethod
    def _apply_stat(proc: Process, stat: str) -> None:
        # comm may contain spaces and parens: fields start after the last ')'.
        rest = stat.rsplit(")", 1)[-1].split()
        if len(rest) > 5:
            proc.pgid, proc.sid, proc.tty = int(rest[2]), int(rest[3]), int(rest[4])

    def on_exec(self, proc: Process, filename: str, argv: list[str] | None) -> None:
        """A successful execve: new image, same pid; /proc is read by ``complete``."""
        if argv:
            proc.exe, proc.args = argv[0], argv[1:]
        else:
            proc.exe, proc.args = filename, []
        proc.exepath = _resolve(filename, proc.cwd)
        proc.env = None
        self.stale.add(proc.pid)

    def complete(self, proc: Process) -> bool:
        """Read what /proc adds after an exec, once; False if it was not stale."""
        if proc.pid not in self.stale:
            return False
        self.stale.discard(proc.pid)
        self.refresh_after_exec(proc)
        return True

    def refresh_after_exec(self, proc: Process) -> None:
        base = f"{self.proc_root}/{proc.pid}"
        exe = _readlink(f"{base}/exe")
        if exe:
            proc.exepath = exe.removesuffix(" (deleted)")
        st = _status_fields(proc.pid)
        if st:
            self._apply_status(proc, st)
        stat = _read(f"{base}/stat")
        if stat:
            self._apply_stat(proc, stat)
        env = _read(f"{base}/environ")
        if env is not None:
            proc.env = dict(kv.split("=", 1) for kv in env.split("\0") if "=" in kv)

    # ------------------------------------------------------------ users

    def user(self, proc: Process, uid: int, container_id: str | None) -> UserInfo:
        name, home, shell = self._passwd_of(proc, container_id).get(uid, (None, None, None))
        login = proc.loginuid
        lname = None
        if login >= 0:
            lname = self._passwd_of(proc, container_id).get(login, (None, None, None))[0]
        return UserInfo(uid, name, home, shell, login, lname)

    def group(self, proc: Process, gid: int, container_id: str | None) -> GroupInfo:
        key = container_id or "host"
        if key not in self._group:
            text = _read(f"{self.proc_root}/{proc.pid}/root/etc/group")
            if text is None:
                return GroupInfo(gid)  # not cached: the next process may be readable
            self._group[key] = _parse_group(text)
        return GroupInfo(gid, self._group[key].get(gid))

    def _passwd_of(
        self, proc: Process, container_id: str | None
    ) -> dict[int, tuple[str, str, str]]:
        # Names come from the sandbox's own /etc/passwd, as Falco does.
        key = container_id or "host"
        table = self._passwd.get(key)
        if table is None:
            text = _read(f"{self.proc_root}/{proc.pid}/root/etc/passwd")
            if text is None:
                return {}
            table = self._passwd[key] = _parse_passwd(text)
        return table

    def forget_container(self, container_id: str) -> None:
        self._passwd.pop(container_id, None)
        self._group.pop(container_id, None)


def _parse_passwd(text: str) -> dict[int, tuple[str, str, str]]:
    out = {}
    for line in text.splitlines():
        f = line.split(":")
        if len(f) >= 7 and f[2].isdigit():
            out[int(f[2])] = (f[0], f[5], f[6])
    return out


def _parse_group(text: str) -> dict[int, str]:
    out = {}
    for line in text.splitlines():
        f = line.split(":")
        if len(f) >= 3 and f[2].isdigit():
            out[int(f[2])] = f[0]
    return out


def _signed32(v: int) -> int:
    return v - (1 << 32) if v >= 1 << 31 else v


def _resolve(path: str, cwd: str) -> str:
    if not path or path.startswith("/"):
        return path
    return os.path.normpath(os.path.join(cwd or "/", path))


def exe_in_upper_layer(proc_root: str, pid: int, exepath: str) -> bool | None:
    """Is the executable in the overlay's upper (writable) layer?

    Finds the upperdir of the process's root mount in /proc/<pid>/mountinfo.
    """
    text = _read(f"{proc_root}/{pid}/mountinfo")
    if not text:
        return None
    for line in text.splitlines():
        pre, _, post = line.partition(" - ")
        fields = pre.split()
        if len(fields) > 4 and fields[4] == "/" and post.startswith("overlay"):
            for opt in post.split()[-1].split(","):
                if opt.startswith("upperdir="):
                    return Path(opt[9:] + exepath).exists()
    return None
