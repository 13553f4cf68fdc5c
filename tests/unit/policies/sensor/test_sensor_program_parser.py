"""Generator output and parser/process-table behaviour on synthetic records."""

from __future__ import annotations

import json

from policies.falco.event import ContainerInfo
from policies.falco.fields import default_registry
from policies.sensor import program as pg
from policies.sensor.cgroups import CgroupMap, DictResolver, container_id_from_cgroup
from policies.sensor.parser import Parser, decode_buf, decode_sockaddr
from policies.sensor.proctable import ProcessTable

REG = default_registry()
CFG = pg.FilterConfig(parent_id=8, subsys_index=11)
CID = "c" * 64


def test_generate_filters_on_corral_parent() -> None:
    prog = pg.generate(
        {"openat", "connect", "init_module", "nosuch"}, CFG, lambda s: s != "init_module"
    )
    assert (
        "sys_enter_openat /(curtask->cgroups->subsys[11]->cgroup->kn->__parent->id == 8"
        in prog.text
    )
    assert "sys_exit_openat /@cg[tid]/" in prog.text
    assert "sched_process_fork" in prog.text and "sched_process_exit" in prog.text
    assert {"openat", "connect", "execve", "chdir"} <= set(prog.syscalls)
    assert prog.unavailable == ("init_module", "nosuch")


def test_exe_records_only_when_asked() -> None:
    assert "exe_file->f_inode" in pg.generate({"execve"}, CFG, lambda s: True).text
    lean = pg.generate({"execve"}, CFG, lambda s: True, exe_details=False).text
    assert "exe_file" not in lean and "sys_exit_execve /@cg[tid]/" in lean


def test_dup_pulls_in_fd_producers() -> None:
    chosen, _ = pg.select_syscalls({"dup2"}, lambda s: True)
    assert {"socket", "connect", "accept", "openat"} <= set(chosen)


class FakeCgroups(CgroupMap):
    def __init__(self) -> None:
        super().__init__(DictResolver({CID: ContainerInfo(full_id=CID, image="img:1")}))
        self._by_cgid[17] = CID


def line(*data: object) -> str:
    return json.dumps({"type": "value", "data": list(data)})


def hdr(code: int, tid: int = 500, comm: str = "cat") -> list[object]:
    return [code, 1_000, tid, tid, 17, 0, 0, comm]


def parser() -> Parser:
    return Parser(FakeCgroups(), ProcessTable(proc_root="/nonexistent"))


def test_exec_then_open() -> None:
    p = parser()
    p.table.procs[400] = p.table.from_proc(400, "sh")
    p.table.procs[400].cwd = "/root"
    fork = p.feed(line(*hdr(pg.REC_FORK, 400, "sh"), 500))
    assert fork is not None and fork.type == "clone" and fork.res == 500
    p.feed(line(pg.REC_STR, 500, 0, "/bin/cat"))
    p.feed(line(*hdr(pg.REC_EXEC_ENTER, comm="sh"), pg.CODES["execve"], 0))
    p.feed(line(pg.REC_ARGV, 500, 0, "cat"))
    p.feed(line(pg.REC_ARGV, 500, 1, "shadow"))
    p.feed(line(pg.REC_STR, 500, 0, "cat"))
    evt = p.feed(
        line(*hdr(pg.REC_EXEC_EXIT), pg.CODES["execve"], 0, 400, 1 << 21, 0, 4294967295, 0, 0, 0)
    )
    assert evt is not None and evt.type == "execve"
    assert evt.proc.exepath == "/bin/cat" and evt.proc.args == ["shadow"]
    assert evt.proc.parent is p.table.procs[400]
    assert evt.proc.loginuid == -1
    assert "CAP_SYS_ADMIN" in str(REG.get("thread.cap_effective").extractor(evt, None))  # type: ignore[union-attr]
    p.feed(line(pg.REC_STR, 500, 1, "shadow"))
    o = p.feed(line(*hdr(pg.REC_SYSCALL), pg.CODES["openat"], 3, 4294967196, 0, 0, 0))
    assert o is not None and o.args["dirfd"] == -100
    assert o.fd is not None and o.fd.name == "/root/shadow" and o.fd.num == 3
    assert o.container is not None and o.container.id == CID[:12]
    assert REG.get("proc.pname").extractor(o, None) == "sh"  # type: ignore[union-attr]


def test_prefiltered_exec_defers_proc_reads() -> None:
    p = Parser(FakeCgroups(), ProcessTable(proc_root="/nonexistent"),
               prefilter=lambda evt: evt.type != "execve")  # fmt: skip
    p.feed(line(pg.REC_STR, 500, 0, "/bin/true"))
    p.feed(line(*hdr(pg.REC_EXEC_ENTER, comm="sh"), pg.CODES["execve"], 0))
    p.feed(line(pg.REC_ARGV, 500, 0, "true"))
    exe = line(*hdr(pg.REC_EXEC_EXIT, comm="true"), pg.CODES["execve"], 0, 400, 0, 0, 0, 0, 0, 0)
    assert p.feed(exe) is None
    assert p.stats.prefiltered == 1 and p.stats.events == 0
    assert 500 in p.table.stale  # /proc not read for an event nobody evaluates
    assert p.table.procs[500].exe == "true"  # but the table knows the new image
    p.feed(line(pg.REC_STR, 500, 1, "/etc/passwd"))
    o = p.feed(line(*hdr(pg.REC_SYSCALL, comm="true"), pg.CODES["openat"], 3, 4294967196, 0, 0, 0))
    assert o is not None and o.proc.exe == "true"
    assert 500 not in p.table.stale and p.stats.events == 1


def test_forget_container_drops_its_caches() -> None:
    p = parser()
    p.table._passwd[CID] = {0: ("root", "/root", "/bin/sh")}
    p.feed(line(pg.REC_STR, 500, 1, "/etc/passwd"))
    assert p.feed(line(*hdr(pg.REC_SYSCALL), pg.CODES["openat"], 3, 4294967196, 0, 0, 0))
    assert any(key[0] == CID for key in p._users)
    p.forget_container(CID)
    assert CID not in p.table._passwd
    assert not any(key[0] == CID for key in p._users)


def test_connect_and_dup2() -> None:
    p = parser()
    p.feed(line(*hdr(pg.REC_SYSCALL), pg.CODES["socket"], 3, 2, 1, 0))
    p.feed(line(pg.REC_STR, 500, 1, "\\x02\\x00\\x01\\xbb\\x5d\\xb8\\xd8\\x22" + "\\x00" * 8))
    c = p.feed(line(*hdr(pg.REC_SYSCALL), pg.CODES["connect"], 0, 3, 0))
    assert c is not None and c.fd is not None
    assert (c.fd.rip, c.fd.rport, c.fd.typechar, c.fd.l4proto) == ("93.184.216.34", 443, "4", "tcp")
    d = p.feed(line(*hdr(pg.REC_SYSCALL), pg.CODES["dup2"], 1, 3, 1))
    assert d is not None and d.fd is not None and d.fd.type == "ipv4"
    assert d.proc.fds[1].type == "ipv4"


def test_lost_and_bad_lines() -> None:
    p = parser()
    p.feed('{"type": "lost_events", "data": {"events": 7}}')
    p.feed("not json")
    assert p.stats.lost == 7 and p.stats.bad_lines == 1


def test_decoders() -> None:
    assert decode_buf("\\x02A") == b"\x02A"
    addr = decode_sockaddr(b"\x01\x00/tmp/s\x00junk")
    assert addr is not None and addr.path == "/tmp/s"
    assert container_id_from_cgroup("11:pids:/corral/abc\n4:memory:/corral/abc\n") == "abc"
    assert container_id_from_cgroup("11:pids:/\n") is None
