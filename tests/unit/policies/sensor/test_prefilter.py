"""The sensor's prefilter: drops only events no rule can match, never a match."""

from __future__ import annotations

from pathlib import Path

import pytest

from policies.falco.engine import RuleEngine
from policies.falco.event import ContainerInfo, Event, FdInfo, Process
from policies.falco.fields import default_registry
from policies.sensor.prefilter import Prefilter, is_local, needs_exe_details

REG = default_registry()
CORRAL_RULES = Path(__file__).resolve().parents[4] / "policies/rules/corral_rules.yaml"
O_WRONLY, O_CREAT = 0o1, 0o100


@pytest.fixture(scope="module")
def engine() -> RuleEngine:
    return RuleEngine.from_files([CORRAL_RULES], REG, strict=True, rule_matching="first")


def agent(name: str = "cat", args: tuple[str, ...] = (), vpid: int | None = 7) -> Process:
    shell = Process(pid=10, name="sh", exe="sh", vpid=2, container_id="a" * 64)
    return Process(pid=11, ppid=10, name=name, exe=name, args=list(args), vpid=vpid,
                   parent=shell, container_id="a" * 64)  # fmt: skip


def event(etype: str, proc: Process, **kw: object) -> Event:
    # num=1: the rules' placeholder macro corral_never_true is evt.num=0.
    return Event(type=etype, tid=proc.pid, pid=proc.pid, proc=proc, num=1,
                 container=ContainerInfo(full_id="a" * 64), **kw)  # type: ignore[arg-type]  # fmt: skip


def open_event(path: str, flags: int = 0, proc: Process | None = None) -> Event:
    fd = FdInfo(num=3, name=path, nameraw=path, flags=flags)
    args = {"dirfd": -100, "name": path, "flags": flags, "mode": 0}
    return event("openat", proc or agent(), res=3, fd=fd, args=args)


def exec_event(name: str, *args: str) -> Event:
    proc = agent(name, args)
    return event("execve", proc, res=0, args={"filename": f"/bin/{name}"})


def connect_event(ip: str, port: int) -> Event:
    fd = FdInfo(num=3, type="ipv4", sockfamily="ip", l4proto="tcp", rip=ip, rport=port,
                name=f"0.0.0.0:0->{ip}:{port}")  # fmt: skip
    return event("connect", agent("curl"), res=-115, fd=fd, args={"fd": 3})


BORING = [
    open_event("/usr/lib/x86_64-linux-gnu/libc.so.6"),
    open_event("/etc/ld.so.cache"),
    open_event("/workspace/out.txt", O_WRONLY | O_CREAT),
    exec_event("true"),
    exec_event("python3", "-m", "pytest"),
    connect_event("127.0.0.1", 8080),
]
ALERTING = [
    open_event("/bin/sh", O_WRONLY),
    open_event("/etc/shadow"),
    open_event("/root/.ssh/id_rsa"),
    open_event("/proc/sys/kernel/core_pattern", O_WRONLY),
    exec_event("xmrig"),
    exec_event("sh", "-c", "curl stratum+tcp://pool.example:3333"),
    connect_event("169.254.169.254", 80),
    connect_event("10.1.2.3", 22),
]


@pytest.mark.parametrize("evt", BORING, ids=lambda e: f"{e.type}-{e.proc.name}")
def test_drops_what_no_rule_matches(engine: RuleEngine, evt: Event) -> None:
    assert engine.evaluate(evt) == []
    assert Prefilter(engine)(evt) is False


@pytest.mark.parametrize("evt", ALERTING, ids=lambda e: f"{e.type}-{e.proc.name}")
def test_keeps_every_match(engine: RuleEngine, evt: Event) -> None:
    assert engine.evaluate(evt), "the case must alert for the test to mean anything"
    assert Prefilter(engine)(evt) is True


def test_unknown_fields_never_drop() -> None:
    # proc.vpid is read from /proc after the prefilter: unknown, so `not vpid = 1`
    # may hold even when the event still says vpid 1.
    rules = """
- rule: Write x
  desc: d
  condition: evt.type = openat and not proc.vpid = 1 and fd.name = /x
  output: o
  priority: ERROR
"""
    engine = RuleEngine.from_texts([("r.yaml", rules)], REG)
    pre = Prefilter(engine)
    assert pre(open_event("/x", proc=agent(vpid=1))) is True
    assert pre(open_event("/y")) is False
    assert (pre.passed, pre.dropped) == (1, 1)


def test_local_fields() -> None:
    assert is_local("fd.name") and is_local("evt.arg.flags") and is_local("proc.pname")
    assert not is_local("proc.vpid") and not is_local("proc.env") and not is_local("user.name")


def test_verdicts_are_memoized_on_local_values(engine: RuleEngine) -> None:
    pre = Prefilter(engine)
    first, again = open_event("/usr/lib/libz.so"), open_event("/usr/lib/libz.so")
    again.num = 2  # evt.num is per event: not part of the key
    assert pre(first) is False and pre(again) is False
    assert len(pre._memo) == 1
    assert pre(open_event("/etc/shadow")) is True and len(pre._memo) == 2


def test_exe_details_only_when_a_rule_reads_them(engine: RuleEngine) -> None:
    assert needs_exe_details(engine) is False
    memfd = """
- rule: Exec from memfd
  desc: d
  condition: evt.type = execve and proc.is_exe_from_memfd = true
  output: o %proc.name
  priority: ERROR
"""
    assert needs_exe_details(RuleEngine.from_texts([("r.yaml", memfd)], REG)) is True
