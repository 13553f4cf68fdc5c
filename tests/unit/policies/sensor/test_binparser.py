"""The compiled backend's binary records (built here with struct) give the events
bpftrace's JSON records give; the loader's arguments; record.h in step with Python."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

from policies.falco.event import ContainerInfo, Event
from policies.sensor import binparser as bp
from policies.sensor import libbpf as lb
from policies.sensor import program as pg
from policies.sensor.cgroups import CgroupMap, DictResolver
from policies.sensor.parser import Parser
from policies.sensor.proctable import ProcessTable
from policies.sensor.sensor import _enlarge_pipe

CID = "d" * 64
BPF = Path(pg.__file__).parent / "bpf"
EXECVE, OPENAT = pg.CODES["execve"], pg.CODES["openat"]


class FakeCgroups(CgroupMap):
    def __init__(self) -> None:
        super().__init__(DictResolver({CID: ContainerInfo(full_id=CID, image="img:1")}))
        self._by_cgid[17] = CID


def new(kind: type[Parser]) -> Any:
    p = kind(FakeCgroups(), ProcessTable(proc_root="/nonexistent"))
    p.table.procs[400] = p.table.from_proc(400, "sh")
    p.table.procs[400].cwd = "/root"
    return p


def rec(code: int, body: bytes, sc: int = 0, tid: int = 500, comm: str = "cat", flags: int = 0,
        ts: int = 1_000) -> bytes:  # fmt: skip
    size = bp.HDR_SIZE + len(body)
    hdr = bp.HDR.pack(size, code, flags, sc, 0, tid, tid, ts, 17, 0, 0, comm.encode())
    return hdr + body


def syscall(sc: int, res: int, vals: list[int], data: bytes = b"", **kw: Any) -> bytes:
    vals = vals + [0] * (bp.N_VALS - len(vals))
    return rec(pg.REC_SYSCALL, bp.SYSCALL.pack(res, *vals) + data, sc, **kw)


def line(*data: object) -> str:
    return json.dumps({"type": "value", "data": list(data)})


def hdr(code: int, tid: int = 500, comm: str = "cat") -> list[object]:
    return [code, 1_000, tid, tid, 17, 0, 0, comm]


def exec_exit(comm: str = "cat", exe: bytes | None = b"cat") -> bytes:
    body = bp.EXEC_EXIT.pack(0, 400, 4294967295, 1 << 21, 0, 136, 3, 1, exe is not None,
                             77, 10, 20, 30, 40)  # fmt: skip
    return rec(pg.REC_EXEC_EXIT, body + (exe + b"\0" if exe is not None else b""), EXECVE,
               comm=comm)  # fmt: skip


SCENARIO_BINARY = [
    rec(pg.REC_FORK, bp.FORK.pack(500, 0), tid=400, comm="sh"),
    rec(
        pg.REC_EXEC_ENTER, bp.EXEC_ENTER.pack(2, 0) + b"/bin/cat\0cat\0shadow\0", EXECVE, comm="sh"
    ),
    exec_exit(),
    syscall(OPENAT, 3, [4294967196, 7, 0, 0], b"shadow\0"),
    syscall(pg.CODES["socket"], 4, [2, 1, 0]),
    syscall(pg.CODES["connect"], 0, [4, 16], b"\x02\x00\x01\xbb\x5d\xb8\xd8\x22" + b"\0" * 8),
    syscall(pg.CODES["dup2"], 1, [4, 1]),
    syscall(pg.CODES["openat2"], 5, [4294967196, 9, 0o100, 0o644], b"/tmp/new\0"),
    rec(pg.REC_EXIT, bp.EXIT.pack(0)),
]
SCENARIO_JSON = [
    line(*hdr(pg.REC_FORK, 400, "sh"), 500),
    line(pg.REC_STR, 500, 0, "/bin/cat"),
    line(*hdr(pg.REC_EXEC_ENTER, comm="sh"), EXECVE, 0),
    line(pg.REC_ARGV, 500, 0, "cat"),
    line(pg.REC_ARGV, 500, 1, "shadow"),
    line(pg.REC_STR, 500, 0, "cat"),
    line(pg.REC_EXE_INO, 500, 77, 10, 20, 30, 40),
    line(*hdr(pg.REC_EXEC_EXIT), EXECVE, 0, 400, 1 << 21, 0, 4294967295, 136, 3, 1),
    line(pg.REC_STR, 500, 1, "shadow"),
    line(*hdr(pg.REC_SYSCALL), OPENAT, 3, 4294967196, 0, 0, 0),
    line(*hdr(pg.REC_SYSCALL), pg.CODES["socket"], 4, 2, 1, 0),
    line(pg.REC_STR, 500, 1, "\\x02\\x00\\x01\\xbb\\x5d\\xb8\\xd8\\x22" + "\\x00" * 8),
    line(*hdr(pg.REC_SYSCALL), pg.CODES["connect"], 0, 4, 0),
    line(*hdr(pg.REC_SYSCALL), pg.CODES["dup2"], 1, 4, 1),
    line(pg.REC_STR, 500, 1, "/tmp/new"),
    line(*hdr(pg.REC_SYSCALL), pg.CODES["openat2"], 5, 4294967196, 0, 0o100, 0o644),
    line(*hdr(pg.REC_EXIT), 0),
]


def view(evt: Event) -> tuple[Any, ...]:
    p, fd = evt.proc, evt.fd
    fdv = None if fd is None else (fd.num, fd.type, fd.name, fd.rip, fd.rport, fd.flags)
    return (evt.type, evt.res, evt.tid, evt.pid, evt.ts_ns, evt.args, p.name, p.exe, p.exepath,
            p.args, p.cwd, p.ppid, p.cap_effective, p.loginuid, p.tty, p.exe_ino,
            p.exe_ino_ctime, p.exe_ino_mtime, p.is_exe_from_memfd,
            evt.container.full_id if evt.container else None, fdv)  # fmt: skip


def test_binary_records_give_the_events_json_records_give() -> None:
    j = new(Parser)
    from_json = [e for e in (j.feed(ln) for ln in SCENARIO_JSON) if e is not None]
    b = new(bp.BinaryParser)
    from_bin: list[Event] = []
    stream = b"".join(SCENARIO_BINARY)
    assert b.feed_bytes(stream, from_bin) == len(stream)
    assert [view(e) for e in from_bin] == [view(e) for e in from_json]
    assert [e.type for e in from_bin] == ["clone", "execve", "openat", "socket", "connect",
                                          "dup2", "openat2", "procexit"]  # fmt: skip
    opened = from_bin[2]
    assert opened.fd is not None and opened.fd.name == "/root/shadow"
    assert from_bin[4].fd is not None and from_bin[4].fd.rip == "93.184.216.34"
    assert b.stats.records == len(SCENARIO_BINARY) and b.stats.bad_lines == 0


def test_a_partial_record_waits_for_the_rest() -> None:
    b = new(bp.BinaryParser)
    stream = b"".join(SCENARIO_BINARY[:4])
    out: list[Event] = []
    used = b.feed_bytes(stream[:-5], out)
    assert used == len(stream) - len(SCENARIO_BINARY[3])
    assert b.feed_bytes(stream[used:], out) == len(SCENARIO_BINARY[3])
    assert [e.type for e in out] == ["clone", "execve", "openat"]


def test_cut_strings_and_loader_records() -> None:
    b = new(bp.BinaryParser)
    out: list[Event] = []
    long_name = b"/x" * 127 + b"\0"
    b.feed_bytes(syscall(OPENAT, 3, [4294967196, len(long_name), 0, 0], long_name, flags=2), out)
    short = syscall(OPENAT, 3, [4294967196, 4, 0, 0], b"/ab\0")
    b.feed_bytes(short, out)
    assert out[0].args.get("_truncated") is True and "_truncated" not in out[1].args
    b.feed_bytes(rec(bp.REC_ATTACHED, b"", tid=0) + rec(bp.REC_LOST, bp.LOST.pack(3)), out)
    assert b.attached and b.stats.lost == 3 and len(out) == 2


def test_exec_without_exe_details_leaves_them_unknown() -> None:
    b = new(bp.BinaryParser)
    out: list[Event] = []
    enter = bp.EXEC_ENTER.pack(1, 0) + b"/bin/true\0true\0"
    b.feed_bytes(rec(pg.REC_EXEC_ENTER, enter, EXECVE) + exec_exit("true", None), out)
    assert out[0].proc.exe_ino is None and out[0].proc.is_exe_from_memfd is None
    assert out[0].proc.args == []


def test_watch_cgroup_proves_the_probes_live() -> None:
    b = new(bp.BinaryParser)
    b.watch_cgid = 17
    b.feed_bytes(syscall(OPENAT, 3, [4294967196, 4, 0, 0], b"/ab\0"), [])
    assert b.watch_seen


FORMAT = """name: sys_enter_accept4
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:int __syscall_nr;\toffset:8;\tsize:4;\tsigned:1;
\tfield:int fd;\toffset:16;\tsize:8;\tsigned:0;
\tfield:struct sockaddr * upeer_sockaddr;\toffset:24;\tsize:8;\tsigned:0;
\tfield:int * upeer_addrlen;\toffset:32;\tsize:8;\tsigned:0;
\tfield:int flags;\toffset:40;\tsize:8;\tsigned:0;
"""


def test_loader_arguments_from_tracepoint_formats(tmp_path: Path) -> None:
    (tmp_path / "sys_enter_accept4").mkdir()
    (tmp_path / "sys_enter_accept4" / "format").write_text(FORMAT)
    fields = lb.tracepoint_fields("accept4", tmp_path)
    assert fields == [("int", "fd"), ("struct sockaddr *", "upeer_sockaddr"),
                      ("int *", "upeer_addrlen"), ("int", "flags")]  # fmt: skip
    assert lb.trace_spec("accept4", fields) == "accept4=0:0.0.0.4/3.1.2.8/0.3.0.4"
    exec_fields = [("int", "fd"), ("const char *", "filename"), ("const char *const *", "argv")]
    assert lb.trace_spec("execveat", exec_fields) == "execveat=1:1.1.0.8"
    cfg = pg.FilterConfig(parent_id=8, subsys_index=11)
    args = lb.loader_args(["accept4"], cfg, exe_details=False, fields_of=lambda s: fields)
    assert args == ["--parent-id", "8", "--subsys", "11", "--no-exe-details",
                    "--trace", "accept4=0:0.0.0.4/3.1.2.8/0.3.0.4"]  # fmt: skip


def test_the_bpf_sources_agree_with_python() -> None:
    listed = re.findall(r"SC\((\w+)\)", (BPF / "syscalls.h").read_text().split("*/", 1)[1])
    assert listed == sorted(pg.SYSCALLS)  # the C list's order is program.CODES
    header = (BPF / "record.h").read_text()
    defines = dict(re.findall(r"#define (\w+) (\d+)", header))
    for name in ("REC_SYSCALL", "REC_EXEC_ENTER", "REC_EXEC_EXIT", "REC_FORK", "REC_EXIT"):
        assert int(defines[name]) == getattr(pg, name)
    assert int(defines["REC_ATTACHED"]) == bp.REC_ATTACHED
    assert int(defines["REC_LOST"]) == bp.REC_LOST
    assert int(defines["STR_MAX"]) == bp.STR_MAX and int(defines["N_VALS"]) == bp.N_VALS
    assert int(defines["MAX_ARGV"]) == pg.MAX_ARGV and int(defines["N_SLOTS"]) == pg.N_ARG_MAPS
    assert int(defines["MAX_SOCKADDR"]) == pg.MAX_SOCKADDR
    assert {lb.KINDS[k]: k for k in lb.KINDS} == {
        int(defines["K_INT"]): pg.INT, int(defines["K_STR"]): pg.STR,
        int(defines["K_SOCKADDR"]): pg.SOCKADDR, int(defines["K_PEER"]): pg.PEER,
        int(defines["K_HOW"]): pg.HOW,
    }  # fmt: skip


async def test_enlarging_the_pipe_of_a_tracer_that_already_exited_is_harmless() -> None:
    """A loader that fails at once closes its pipe before the reader enlarges
    it: that must reach the supervisor as EOF, not as an exception."""
    proc = await asyncio.create_subprocess_exec("/bin/true", stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    assert await proc.stdout.read() == b""
    await proc.wait()
    await asyncio.sleep(0)  # the transport closes its pipe
    _enlarge_pipe(proc.stdout)
