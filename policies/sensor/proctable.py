"""Process table: who is who inside the sandboxes.

Built from the sensor's fork/exec/exit records, completed from /proc/<pid>
for processes first seen mid-flight (started before the sensor, or whose
fork was lost). Parent links make proc.pname / proc.aname[N] cheap.

Copy on change: an event keeps the ``Process`` it was parsed with, so that
it reports the process as it was at the syscall (Falco's view) even when the
process execs, renames itself, changes uid or directory later in the same
batch. Each such change makes a *successor* (a copy, then changed) that
replaces the old object in ``procs`` under the same pid; the old object is
never changed again. A process whose ancestor got a successor gets one too,
pointing at the new ancestor, at its next event (checked once per change:
``_epoch``), so ``proc.pname`` and ``proc.aname`` follow the parent's exec as
Falco's do.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from operator import attrgetter
from pathlib import Path

from policies.falco.event import GroupInfo, Process, UserInfo

MAX_PENDING_FORKS = 65536
_SLOTS: tuple[str, ...] = Process.__slots__  # type: ignore[attr-defined]
_values = attrgetter(*_SLOTS)
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
        # child tid -> (parent pid, fork ts, the parent as it was at the fork);
        # resolved when the child shows up as a process
        self._forks: OrderedDict[int, tuple[int, int, Process | None]] = OrderedDict()
        self.proc_root = proc_root
        self._passwd: dict[str, dict[int, tuple[str, str, str]]] = {}
        self._group: dict[str, dict[int, str]] = {}
        # pid -> the process (object) whose /proc details (vpid, caps, env...) were
        # not read since its exec: read only once one of its events is worth evaluating.
        self.stale: dict[int, Process] = {}
        # Bumped whenever a successor replaces a process; pid -> the epoch at which
        # that pid's ancestors were last known current.
        self._epoch = 0
        self._checked: dict[int, int] = {}

    # ------------------------------------------------------------ records

    def on_fork(self, parent_pid: int, child_tid: int, ts: int) -> None:
        self._forks[child_tid] = (parent_pid, ts, self.procs.get(parent_pid))
        if len(self._forks) > MAX_PENDING_FORKS:
            self._forks.popitem(last=False)

    def note_name(self, pid: int, tid: int, comm: str) -> None:
        """A record (not an event) said what a known process's main thread is
        called now: a rename makes a successor, as ``lookup`` would."""
        proc = self.procs.get(pid)
        if proc is not None and comm and tid == pid and proc.name != comm:
            self.successor(proc).name = comm

    def on_exit(self, tid: int, pid: int) -> Process | None:
        self._forks.pop(tid, None)
        if tid != pid:
            return None
        self.stale.pop(pid, None)
        self._checked.pop(pid, None)
        proc = self.procs.pop(pid, None)
        if proc is not None:
            proc.exited = True  # children keep their reference for the ancestry
        return proc

    def lookup(self, pid: int, tid: int, comm: str, ts: int, *, fresh: bool = False) -> Process:
        """The process of an event by ``pid`` now; ``fresh``: a new successor even
        if nothing changed (an exec is about to change it)."""
        proc = self.procs.get(pid)
        if proc is None:
            proc = self._new(pid, tid, comm, ts)
            self.procs[pid] = proc
            self._checked[pid] = self._epoch
            return proc
        if self._checked.get(pid) != self._epoch:
            proc = self._with_current_ancestors(proc)
        # A rename is the main thread's (prctl(PR_SET_NAME), runc's stages) or an
        # exec's. Other threads may carry names of their own (a JVM's, a browser's):
        # the process keeps its name, as Falco's threads keep the comm they were
        # cloned with, and alternating threads do not make a successor per event.
        if fresh or (comm and proc.name != comm and tid == pid):
            proc = self.successor(proc)
            if comm:
                proc.name = comm
        return proc

    def successor(self, proc: Process, parent: Process | None = None) -> Process:
        """A copy of ``proc`` that replaces it in the table (if it is there): the
        caller changes the copy; events that hold ``proc`` keep what it was."""
        new = _copy(proc)
        if parent is not None:
            new.parent = parent
        if self.procs.get(proc.pid) is proc:
            self.procs[proc.pid] = new
            if self.stale.get(proc.pid) is proc:
                self.stale[proc.pid] = new
            self._epoch += 1  # its children's parent links now lead to the old one
            self._checked[proc.pid] = self._epoch
        return new

    def _latest(self, proc: Process) -> Process:
        """The live successor of ``proc``, or ``proc``."""
        if proc.exited:
            return proc
        now = self.procs.get(proc.pid)
        return proc if now is None else now

    def _with_current_ancestors(self, proc: Process) -> Process:
        """``proc``, or a successor of it (and of its ancestors, as needed) whose
        parent links lead to the table's current objects."""
        chain = proc.ancestors()
        top = -1
        for i, a in enumerate(chain):
            if self._latest(a) is not a:
                top = i
        if top >= 0:
            parent = self._latest(chain[top])
            for a in reversed(chain[:top]):
                cur = self._latest(a)
                if cur.parent is not parent:
                    cur = self.successor(cur, parent)
                parent = cur
            if proc.parent is not parent:
                proc = self.successor(proc, parent)
        self._checked[proc.pid] = self._epoch
        return proc

    def _new(self, pid: int, tid: int, comm: str, ts: int) -> Process:
        fork = self._forks.pop(pid, None)
        # The child runs the image its parent had at the fork, even if the parent
        # has exec'd since; its parent link is the parent's current object.
        parent = (fork[2] or self.procs.get(fork[0])) if fork else None
        if parent is not None and fork is not None:
            child = self._clone(parent, pid, comm, fork[1])
            child.parent = self._latest(parent)
            if self.stale.get(parent.pid) is parent:
                self.stale[pid] = child
            return child
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
        """A successful execve: new image, same pid; /proc is read by ``complete``.
        ``proc`` is the successor ``lookup(..., fresh=True)`` made for it."""
        if argv:
            proc.exe, proc.args = argv[0], argv[1:]
        else:
            proc.exe, proc.args = filename, []
        proc.exepath = _resolve(filename, proc.cwd)
        proc.env = None
        self.stale[proc.pid] = proc

    def complete(self, proc: Process) -> bool:
        """Read what /proc adds after an exec, once; False if it was not stale."""
        if self.stale.get(proc.pid) is not proc:
            return False
        del self.stale[proc.pid]
        self.refresh_after_exec(proc)
        return True

    def refresh_after_exec(self, proc: Process) -> None:
        base = f"{self.proc_root}/{proc.pid}"
        st = _status_fields(proc.pid)
        # Exec'd again since (its name in /proc is another's): /proc's exe and
        # environment are that later program's; keep what the records said.
        exec_since = bool(proc.name and st.get("Name") and st["Name"] != proc.name[:15])
        if not exec_since:
            exe = _readlink(f"{base}/exe")
            if exe:
                proc.exepath = exe.removesuffix(" (deleted)")
        if st:
            self._apply_status(proc, st)
        stat = _read(f"{base}/stat")
        if stat:
            self._apply_stat(proc, stat)
        env = _read(f"{base}/environ") if not exec_since else None
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


def _copy(proc: Process) -> Process:
    """A shallow copy (twice copy.copy's speed: one per exec or rename)."""
    new: Process = object.__new__(Process)
    for name, value in zip(_SLOTS, _values(proc), strict=True):
        setattr(new, name, value)
    return new


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
