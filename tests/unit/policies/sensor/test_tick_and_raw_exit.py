"""The watermark (``Sensor.tick``) against a fake loader that speaks the record
protocol, the REC_TICK record, and the loader's arguments for the raw sys_exit
program (calls seccomp denies)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from policies.falco.event import ContainerInfo, Event
from policies.sensor import binparser as bp
from policies.sensor import libbpf as lb
from policies.sensor import program as pg
from policies.sensor.cgroups import CgroupMap, DictResolver
from policies.sensor.proctable import ProcessTable
from policies.sensor.sensor import Sensor

CID = "f" * 64
BPF = Path(pg.__file__).parent / "bpf"
OPENAT = pg.CODES["openat"]
CAP_S = 30.0  # a cap so that a broken test fails instead of hanging, not a timing

# Answers `tick N` with an openat record of pid N (written before the tick, as
# the kernel's records are) and then REC_TICK N; `mute` stops answering, `lose`
# reports lost records, `exit` exits.
FAKE_LOADER = f"""
import struct, sys
HDR = struct.Struct({bp.HDR.format!r})
def rec(code, body=b"", pid=0, sc=0):
    return HDR.pack(HDR.size + len(body), code, 0, sc, 0, pid, pid, 1, 17, 0, 0, b"x") + body
out = sys.stdout.buffer
out.write(rec({bp.REC_ATTACHED})); out.flush()
mute = False
for line in sys.stdin:
    word, _, arg = line.strip().partition(" ")
    if word == "tick" and not mute:
        n = int(arg)
        body = struct.pack("<q6Q", 3, 4294967196, 3, 0, 0, 0, 0) + b"/f\\0"
        out.write(rec({pg.REC_SYSCALL}, body, pid=n, sc={OPENAT}))
        out.write(rec({bp.REC_TICK}, struct.pack("<Q", n)))
    elif word == "mute":
        mute = True
    elif word == "lose":
        out.write(rec({bp.REC_LOST}, struct.pack("<Q", 5)))
    elif word == "exit":
        sys.exit(3)
    out.flush()
"""


class FakeCgroups(CgroupMap):
    def __init__(self) -> None:
        super().__init__(DictResolver({CID: ContainerInfo(full_id=CID, image="busybox:1")}))
        self._by_cgid[17] = CID


class Harness:
    """A Sensor whose libbpf run is the fake loader (no root, no BPF)."""

    def __init__(self) -> None:
        self.sensor = Sensor({"openat"}, backend="libbpf", loader=Path(sys.executable))
        self.sensor.parser = bp.BinaryParser(FakeCgroups(), ProcessTable(proc_root="/nonexistent"))
        self.seen: list[Event] = []
        self.sensor.add_callback(self.seen.append)

        async def no_watch() -> None:
            await asyncio.sleep(3600)

        self.sensor._watch_parent = no_watch  # type: ignore[method-assign]
        self.task: asyncio.Task[Any] | None = None

    async def start(self) -> None:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", FAKE_LOADER, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        self.sensor._proc = proc
        self.sensor._ready.set()
        self.task = asyncio.create_task(self.sensor._drain(proc, self.sensor._read_binary))

    def send(self, line: str) -> None:
        proc = self.sensor._proc
        assert proc is not None and proc.stdin is not None
        proc.stdin.write(line.encode() + b"\n")

    async def stop(self) -> None:
        await self.sensor.stop()
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


async def test_tick_is_ok_after_the_records_before_it_were_delivered() -> None:
    h = Harness()
    await h.start()
    try:
        for _ in range(20):
            assert await h.sensor.tick(CAP_S) == "ok"
            n = h.sensor._tick_seq
            # the record the "kernel" wrote before the tick was answered is delivered
            assert h.seen and h.seen[-1].pid == n and h.seen[-1].type == "openat"
        assert h.sensor.stats.ticks == 20 and h.sensor.stats.gaps == 0
    finally:
        await h.stop()


async def test_concurrent_callers_share_one_tick() -> None:
    h = Harness()
    await h.start()
    try:
        got = await asyncio.gather(*(h.sensor.tick(CAP_S) for _ in range(5)))
        assert got == ["ok"] * 5
        assert h.sensor._tick_seq == 1 and len(h.seen) == 1 and h.sensor.stats.ticks == 1
    finally:
        await h.stop()


async def test_behind_when_unanswered_and_down_when_the_loader_exits() -> None:
    h = Harness()
    await h.start()
    try:
        h.send("mute")
        assert await h.sensor.tick(0.2) == "behind"  # it never answers
        assert h.sensor.stats.ticks_behind == 1
        pending = asyncio.create_task(h.sensor.tick(CAP_S))
        await asyncio.sleep(0)  # its tick is written
        h.send("exit")
        assert await pending == "down"  # no answer will come: not "behind"
        assert h.task is not None
        assert await asyncio.wait_for(h.task, CAP_S) == 3
        assert await h.sensor.tick(CAP_S) == "down"
    finally:
        await h.stop()


async def test_lost_records_are_a_gap() -> None:
    h = Harness()
    await h.start()
    try:
        h.send("lose")
        assert await h.sensor.tick(CAP_S) == "ok"
        assert h.sensor.stats.gaps == 1 and h.sensor.stats.lost == 5
        assert await h.sensor.tick(CAP_S) == "ok"
        assert h.sensor.stats.gaps == 1
    finally:
        await h.stop()


async def test_tick_is_unsupported_on_bpftrace_and_down_before_start() -> None:
    assert await Sensor({"openat"}, backend="bpftrace").tick(1.0) == "unsupported"
    s = Sensor({"openat"}, backend="libbpf", loader=Path(sys.executable))
    assert await s.tick(1.0) == "down"


def test_tick_record_is_parsed_in_stream_order() -> None:
    p = bp.BinaryParser(FakeCgroups(), ProcessTable(proc_root="/nonexistent"))
    hdr = bp.HDR.pack(bp.HDR_SIZE + 8, bp.REC_TICK, 0, 0, 0, 0, 0, 1, 0, 0, 0, b"")
    out: list[Event] = []
    data = hdr + bp.TICK.pack(41) + hdr + bp.TICK.pack(42)
    assert p.feed_bytes(data, out) == len(data) and out == []
    assert p.tick == 42 and p.stats.records == 2


def test_record_h_knows_the_tick_and_the_raw_numbers() -> None:
    defines = dict(re.findall(r"#define (\w+) (\d+)", (BPF / "record.h").read_text()))
    assert int(defines["REC_TICK"]) == bp.REC_TICK
    assert max(lb.RAW_EXIT_NRS.values()) < int(defines["RAW_NR_MAX"])
    assert set(lb.RAW_EXIT_NRS) <= set(pg.SYSCALLS)
    assert set(lb.RAW_EXIT_FIELDS) == set(lb.RAW_EXIT_NRS)


CFG = pg.FilterConfig(parent_id=8, subsys_index=11)


def _fields(name: str) -> lb.Fields:
    return lb.RAW_EXIT_FIELDS.get(name) or [("int", "dfd"), ("const char *", "filename"),
                                            ("int", "flags"), ("umode_t", "mode")]  # fmt: skip


def test_denied_calls_go_to_the_raw_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lb.platform, "machine", lambda: "x86_64")
    args = lb.loader_args(["mount", "openat", "ptrace", "umount", "umount2"], CFG,
                          fields_of=_fields)  # fmt: skip
    traced = [args[i + 1].split("=")[0] for i, a in enumerate(args) if a == "--trace"]
    assert traced == ["mount", "openat", "ptrace", "umount2"]  # umount: the same syscall
    assert "mount=0:1.0.0.8/1.1.0.8/0.3.0.8" in args
    raw = [args[i + 1] for i, a in enumerate(args) if a == "--raw-exit"]
    assert raw == ["165:mount", "101:ptrace", "166:umount2"]
    only_umount = lb.loader_args(["umount"], CFG, fields_of=_fields)
    assert only_umount[-2:] == ["--raw-exit", "166:umount"]
    # a kernel without the module calls' tracepoints still watches them
    assert (
        lb.available("finit_module")
        and lb.tracepoint_fields("finit_module", Path("/nonexistent"))
        == lb.RAW_EXIT_FIELDS["finit_module"]
    )


def test_no_raw_exit_off_x86_64(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lb.platform, "machine", lambda: "aarch64")
    args = lb.loader_args(["mount", "umount"], CFG, fields_of=_fields)
    assert "--raw-exit" not in args and args.count("--trace") == 2


def test_bpftrace_writes_an_exit_whose_enter_seccomp_skipped() -> None:
    text = pg.generate({"mount", "openat"}, CFG, lambda s: True).text
    denied = text.index("tracepoint:syscalls:sys_exit_mount /@cg[tid] == 0 && (")
    normal = text.index("tracepoint:syscalls:sys_exit_mount /@cg[tid]/")
    assert denied < normal  # attached first: it runs before the exit probe deletes @cg
    assert f"comm, {pg.CODES['mount']}, args->ret, 0, 0, 0));" in text[denied:normal]
    assert "sys_exit_openat /@cg[tid] == 0" not in text  # only the calls seccomp denies
