"""The process an event reports is the one at its syscall: a later exec, rename,
chdir or setuid in the same batch makes a successor and leaves earlier events be."""

from __future__ import annotations

from typing import Any

from policies.falco.event import ContainerInfo, Event
from policies.falco.fields import default_registry
from policies.sensor import binparser as bp
from policies.sensor import program as pg
from policies.sensor.binparser import BinaryParser
from policies.sensor.cgroups import CgroupMap, DictResolver
from policies.sensor.proctable import ProcessTable

REG = default_registry()
CID = "e" * 64
EXECVE, OPENAT = pg.CODES["execve"], pg.CODES["openat"]


class FakeCgroups(CgroupMap):
    def __init__(self) -> None:
        super().__init__(DictResolver({CID: ContainerInfo(full_id=CID, image="busybox:1")}))
        self._by_cgid[17] = CID


def rec(code: int, body: bytes, sc: int = 0, tid: int = 500, comm: str = "sh",
        uid: int = 0, pid: int | None = None) -> bytes:  # fmt: skip
    size = bp.HDR_SIZE + len(body)
    pid = tid if pid is None else pid
    return bp.HDR.pack(size, code, 0, sc, 0, tid, pid, 1_000, 17, uid, 0, comm.encode()) + body


def openat(path: str, res: int = 3, **kw: Any) -> bytes:
    vals = [4294967196, len(path) + 1, 0o1101, 0o644, 0, 0]
    return rec(pg.REC_SYSCALL, bp.SYSCALL.pack(res, *vals) + path.encode() + b"\0", OPENAT, **kw)


def execve(filename: str, argv: list[str], comm: str, tid: int = 500,
           old_comm: str = "sh") -> bytes:  # fmt: skip
    strs = b"".join(s.encode() + b"\0" for s in [filename, *argv])
    enter = rec(pg.REC_EXEC_ENTER, bp.EXEC_ENTER.pack(len(argv), 0) + strs, EXECVE, tid=tid,
                comm=old_comm)  # fmt: skip
    body = bp.EXEC_EXIT.pack(0, 400, 4294967295, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0)
    return enter + rec(pg.REC_EXEC_EXIT, body, EXECVE, tid=tid, comm=comm)


def fork(parent: int, child: int, comm: str = "sh") -> bytes:
    return rec(pg.REC_FORK, bp.FORK.pack(child, 0), tid=parent, comm=comm)


def batch(*records: bytes) -> tuple[BinaryParser, list[Event]]:
    p = BinaryParser(FakeCgroups(), ProcessTable(proc_root="/nonexistent"))
    p.table.procs[400] = p.table.from_proc(400, "runc")
    p.table.procs[400].cwd = "/"
    # The shell: a child of 400 that exec'd sh.
    first = fork(400, 500, "runc") + execve("/bin/sh", ["sh", "-c", "..."], "sh", old_comm="runc")
    out: list[Event] = []
    data = first + b"".join(records)
    assert p.feed_bytes(data, out) == len(data)
    first_exec = out[1]
    return p, [e for e in out if e.type != "clone" and e is not first_exec]


def field(evt: Event, name: str, arg: str | None = None) -> Any:
    return REG.get(name).extractor(evt, arg)  # type: ignore[union-attr]


def test_write_then_exec_in_one_batch_reports_the_shell() -> None:
    # busybox `sh -c 'echo x > /bin/e2; sleep 2'`: the shell writes, then execs sleep.
    _, (write, exe) = batch(openat("/bin/e2"), execve("/bin/sleep", ["sleep", "2"], "sleep"))
    assert write.type == "openat" and write.fd is not None and write.fd.name == "/bin/e2"
    assert field(write, "proc.name") == "sh" and field(write, "proc.exe") == "sh"
    assert field(write, "proc.cmdline") == "sh -c ..."
    assert field(write, "proc.pname") == "runc"
    assert exe.type == "execve" and field(exe, "proc.name") == "sleep"
    assert field(exe, "proc.cmdline") == "sleep 2" and field(exe, "proc.pname") == "runc"
    assert write.proc is not exe.proc and write.proc.pid == exe.proc.pid == 500


def test_exec_of_the_same_name_still_makes_a_new_process() -> None:
    p, (read, exe) = batch(openat("/etc/shadow"), execve("/bin/sh", ["sh", "-c", "ls"], "sh"))
    assert field(read, "proc.cmdline") == "sh -c ..."
    assert field(exe, "proc.cmdline") == "sh -c ls"
    assert p.table.procs[500] is exe.proc


def test_busybox_applet_reexec_as_exe() -> None:
    # busybox runs an applet by exec'ing /proc/self/exe: comm becomes "exe".
    _, (write, exe, later) = batch(
        openat("/usr/bin/evil2"),
        execve("/proc/self/exe", ["ls", "-la"], "exe"),
        openat("/bin/x", comm="exe"),
    )
    assert field(write, "proc.name") == "sh"
    assert field(exe, "proc.name") == "exe" and field(later, "proc.name") == "exe"
    assert later.proc is exe.proc


def test_rename_keeps_earlier_events() -> None:
    _, (before, after) = batch(openat("/a"), openat("/b", comm="worker"))
    assert field(before, "proc.name") == "sh" and field(after, "proc.name") == "worker"
    assert field(after, "proc.cmdline") == "worker -c ..."


def test_setuid_and_chdir_keep_earlier_events() -> None:
    chdir = pg.CODES["chdir"]
    cd = rec(pg.REC_SYSCALL, bp.SYSCALL.pack(0, 5, 0, 0, 0, 0, 0) + b"/tmp\0", chdir)
    _, (before, cd_evt, rel, as_user) = batch(openat("/x"), cd, openat("y"), openat("/z", uid=1000))
    assert before.proc.cwd == "/" and rel.proc.cwd == "/tmp"
    assert rel.fd is not None and rel.fd.name == "/tmp/y"
    assert before.proc.uid == 0 and as_user.proc.uid == 1000
    assert cd_evt.type == "chdir"


def test_children_follow_their_parents_exec() -> None:
    # `sh -c 'sleep 5 & exec foo'`: the child was forked before the exec, runs
    # sh's image until it execs, and its parent is then foo (as Falco says).
    _, events = batch(
        fork(500, 600),
        openat("/bin/a", tid=600),
        execve("/usr/bin/foo", ["foo"], "foo"),
        openat("/bin/b", tid=600),
        openat("/bin/c", comm="foo"),
    )
    a, exe, b, c = events
    assert field(a, "proc.name") == "sh" and field(a, "proc.pname") == "sh"
    assert field(a, "proc.cmdline") == "sh -c ..."
    assert field(b, "proc.name") == "sh" and field(b, "proc.pname") == "foo"
    assert field(c, "proc.pname") == "runc" and field(exe, "proc.name") == "foo"
    # the grandchild chain stays whole
    assert [q.pid for q in b.proc.ancestors()] == [500, 400]


def test_child_forked_before_exec_but_seen_after_runs_the_old_image() -> None:
    _, (exe, child) = batch(
        fork(500, 600),
        execve("/usr/bin/foo", ["foo"], "foo"),
        openat("/bin/a", tid=600),
    )
    assert field(child, "proc.cmdline") == "sh -c ..." and field(child, "proc.pname") == "foo"
    assert field(exe, "proc.name") == "foo"


def test_grandparent_exec_reaches_grandchildren() -> None:
    _, events = batch(
        fork(500, 600),
        openat("/a", tid=600),
        fork(600, 700),
        openat("/b", tid=700),
        execve("/usr/bin/foo", ["foo"], "foo"),
        openat("/c", tid=700),
    )
    b, c = events[1], events[3]
    assert field(b, "proc.aname", "2") == "sh" and field(c, "proc.aname", "2") == "foo"
    assert field(c, "proc.pname") == "sh"


def test_a_thread_with_a_name_of_its_own_does_not_rename_the_process() -> None:
    p, (main, thread, main_again, renamed) = batch(
        openat("/a"),
        openat("/b", tid=501, pid=500, comm="worker-1"),  # a thread of 500
        openat("/c"),
        openat("/d", comm="server"),  # the main thread renames itself
    )
    assert main.proc is thread.proc is main_again.proc
    assert field(thread, "proc.name") == "sh" and thread.tid == 501
    assert field(renamed, "proc.name") == "server" and field(main, "proc.name") == "sh"
    assert p.table.procs[500] is renamed.proc


def test_a_rename_seen_only_on_the_fork_record_reaches_the_child() -> None:
    # busybox: exec /proc/self/exe (comm "exe"), prctl to "sh", fork, the child
    # (a cat) reads: its parent is sh, though sh made no event since the rename.
    p = BinaryParser(FakeCgroups(), ProcessTable(proc_root="/nonexistent"), {"openat"})
    p.table.procs[400] = p.table.from_proc(400, "runc")
    out: list[Event] = []
    data = (
        fork(400, 500, "runc")
        + execve("/proc/self/exe", ["sh", "-c", "cat x"], "exe", old_comm="runc")
        + fork(500, 600, comm="sh")
        + openat("/etc/shadow", tid=600, comm="cat")
    )
    p.feed_bytes(data, out)
    (read,) = out
    assert field(read, "proc.pname") == "sh" and field(read, "proc.name") == "cat"
