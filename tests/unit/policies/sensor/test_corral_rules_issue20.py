"""Corral's rules on the events issue 20 is about: busybox's exe re-exec is the
agent's (only runc's own exe is the runtime), and calls seccomp denies alert."""

from __future__ import annotations

from pathlib import Path

import pytest

from policies.falco.engine import RuleEngine
from policies.falco.event import ContainerInfo, Event, FdInfo, Process
from policies.falco.fields import default_registry

RULES = Path(__file__).resolve().parents[4] / "policies/rules/corral_rules.yaml"
BOX = ContainerInfo(full_id="a" * 64, image="busybox")
RUNC = Process(pid=400, name="runc")


@pytest.fixture(scope="module")
def engine() -> RuleEngine:
    return RuleEngine.from_files([RULES], default_registry(), strict=True, rule_matching="first")


def rules(engine: RuleEngine, evt: Event) -> list[str]:
    return [m.rule for m in engine.evaluate(evt)]


def mount(proc: Process) -> Event:
    args = {"dev": "none", "dir": "/mnt", "flags": 0}
    return Event(type="mount", res=-1, proc=proc, container=BOX, args=args, num=1)


def test_busybox_applet_exe_is_the_agent(engine: RuleEngine) -> None:
    applet = Process(pid=501, vpid=7, name="exe", exe="sleep", args=["2"], parent=RUNC)
    assert rules(engine, mount(applet)) == ["Mount in sandbox"]
    write = Event(type="openat", res=3, proc=applet, container=BOX, num=1,
                  args={"name": "/bin/e2", "flags": 0o1101},
                  fd=FdInfo(num=3, type="file", name="/bin/e2", flags=0o1101))  # fmt: skip
    assert rules(engine, write) == ["Write below binary dir in sandbox"]
    orphan = Process(pid=502, vpid=9, name="exe")  # no known parent: no pass either
    assert rules(engine, mount(orphan)) == ["Mount in sandbox"]


def test_runcs_own_exe_stays_exempt(engine: RuleEngine) -> None:
    by_argv = Process(pid=600, name="exe", exe="/proc/self/exe", args=["init"], parent=RUNC)
    in_host_pidns = Process(pid=601, vpid=601, name="exe")  # seen mid-flight, argv gone
    init = Process(pid=602, vpid=1, name="runc:[2:INIT]")
    for proc in (by_argv, in_host_pidns, init):
        assert rules(engine, mount(proc)) == [], proc.name


def test_a_refused_ptrace_alerts_at_error(engine: RuleEngine) -> None:
    sh = Process(pid=700, vpid=5, name="sh", parent=RUNC)
    evt = Event(type="ptrace", res=-1, proc=sh, container=BOX, num=1,
                args={"request": 16, "pid": 1})  # fmt: skip
    (match,) = engine.evaluate(evt)
    assert match.rule == "PTRACE denied in sandbox" and match.priority.name == "ERROR"


def test_runcs_mounts_of_its_binary_copy_are_the_runtime(engine: RuleEngine) -> None:
    """runc unmounts the read-only copy of itself from inside the sandbox's cgroup
    (seen on the test stack: process=exe, umount2 of <runc root>/<id>/runc.XXXXXX, res 0)."""
    exe = Process(pid=17514, vpid=3, name="exe")
    target = "/run/corral/runc/corral/" + "a" * 64 + "/runc.Z5SwuP"

    def umount(res: int, name: str) -> Event:
        args = {"name": name, "flags": 2}
        return Event(type="umount2", res=res, proc=exe, container=BOX, args=args, num=1)

    assert rules(engine, umount(0, target)) == []
    bind = Event(type="mount", res=0, proc=exe, container=BOX, num=1,
                 args={"dev": "/usr/bin/runc", "dir": target, "flags": 4096})  # fmt: skip
    assert rules(engine, bind) == []
    # The agent's own attempt is refused by seccomp: it still alerts, whatever the path.
    assert rules(engine, umount(-1, target)) == ["Mount in sandbox"]
    assert rules(engine, umount(-1, "/proc/sys")) == ["Mount in sandbox"]


def test_an_attempt_on_corrals_tools_is_tampering(engine: RuleEngine) -> None:
    """The init and the exec agent below /.corral are read-only; writing one fails."""
    sh = Process(pid=800, vpid=6, name="sh", parent=RUNC)
    flags = 0o1101  # O_WRONLY|O_CREAT|O_TRUNC
    write = Event(type="openat", res=-30, proc=sh, container=BOX, num=1,  # EROFS
                  args={"name": "/.corral/agent", "flags": flags},
                  fd=FdInfo(num=-1, type="file", name="/.corral/agent", flags=flags))  # fmt: skip
    assert rules(engine, write) == ["Tamper with Corral tools in sandbox"]
    rm = Event(type="unlinkat", res=-30, proc=sh, container=BOX, num=1,
               args={"dirfd": -100, "name": "/.corral/init", "flags": 0})  # fmt: skip
    assert rules(engine, rm) == ["Tamper with Corral tools in sandbox"]
    read = Event(type="openat", res=3, proc=sh, container=BOX, num=1,
                 args={"name": "/.corral/init", "flags": 0},
                 fd=FdInfo(num=3, type="file", name="/.corral/init", flags=0))  # fmt: skip
    assert rules(engine, read) == []


def test_a_signal_to_corrals_pid_1_is_tampering(engine: RuleEngine) -> None:
    """PID 1 is Corral's (the exec agent): a signal to it from inside, even signal
    0's probe, is an attempt on the runtime's own process (issue 21)."""
    sh = Process(pid=800, vpid=6, name="sh", parent=RUNC)

    def kill(proc: Process, pid: int, sig: int) -> Event:
        return Event(type="kill", res=0, proc=proc, container=BOX, num=1,
                     args={"pid": pid, "sig": sig})  # fmt: skip

    assert rules(engine, kill(sh, 1, 0)) == ["Signal Corral's PID 1 in sandbox"]
    assert rules(engine, kill(sh, 1, 15)) == ["Signal Corral's PID 1 in sandbox"]
    assert rules(engine, kill(sh, 7, 15)) == []  # the agent's own processes: fine
    agent = Process(pid=700, vpid=1, name="agent")
    assert rules(engine, kill(agent, 1, 0)) == []  # PID 1 itself
