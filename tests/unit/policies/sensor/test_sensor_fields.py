"""Field extractors on synthetic events."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from policies.falco.event import ContainerInfo, Event, FdInfo, GroupInfo, Process, UserInfo
from policies.falco.fieldapi import ArgKind, FieldType
from policies.falco.fields import default_registry

REG = default_registry()
UPSTREAM = Path("/work/shared/falco/upstream/falco_rules.yaml")


def get(evt: Event, name: str, arg: str | int | None = None) -> object:
    spec = REG.get(name)
    assert spec is not None, name
    return spec.extractor(evt, arg)


def chain() -> Process:
    init = Process(pid=100, name="sh", exe="/bin/sh", exepath="/bin/sh", sid=100, vpid=1, vpgid=1)
    bash = Process(pid=101, ppid=100, name="bash", exe="bash", exepath="/bin/bash", args=["-i"],
                   parent=init, sid=100, vpid=2, vpgid=2)  # fmt: skip
    return Process(pid=102, ppid=101, name="cat", exe="cat", exepath="/usr/bin/cat",
                   args=["/etc/shadow"], cwd="/root", parent=bash, sid=100, vpid=3, vpgid=2,
                   tty=34816, cap_effective=(1 << 21) | (1 << 16), start_ts=1_000)  # fmt: skip


def open_event(flags: int = 0, res: int = 3, name: str = "/etc/shadow") -> Event:
    proc = chain()
    fd = FdInfo(num=res if res >= 0 else -1, type="file", name=name, nameraw=name, flags=flags)
    return Event(
        type="openat", dir="<", ts_ns=6_000_001_000, tid=102, pid=102, res=res,
        args={"dirfd": -100, "name": name, "flags": flags, "mode": 0},
        proc=proc, fd=fd, num=7, wall_ns=1_700_000_000_123_456_789,
        container=ContainerInfo(full_id="a" * 64, name="sb-1", image="reg.io/team/img:1.2",
                                labels={"corral.workflow_id": "wf-1"}),
        user=UserInfo(uid=0, name="root", loginuid=-1), group=GroupInfo(gid=0, name="root"),
    )  # fmt: skip


def test_every_upstream_field_is_registered() -> None:
    if not UPSTREAM.exists():
        pytest.skip("upstream rules not present")
    text = "\n".join(
        ln for ln in UPSTREAM.read_text().splitlines() if not ln.lstrip().startswith("#")
    )
    pat = r"\b((?:evt|proc|fd|user|group|container|k8s|thread)\.[a-z0-9_.]*[a-z0-9_])(\[)?"
    missing = set()
    for name, bracket in re.findall(pat, text):
        if name in ("k8s.io", "user.log"):  # an image registry and a log file name
            continue
        base = (
            name
            if name in REG
            else next((p for p in ("evt.arg", "evt.rawarg") if name.startswith(p + ".")), None)
        )
        spec = REG.get(base) if base else None
        if spec is None or (bracket and spec.arg is ArgKind.NONE):
            missing.add(name)
    assert not missing


def test_arg_kinds() -> None:
    assert REG.get("proc.aname").arg is ArgKind.OPTIONAL  # type: ignore[union-attr]
    assert REG.get("proc.apid").arg is ArgKind.OPTIONAL  # type: ignore[union-attr]
    assert REG.get("evt.arg").arg is ArgKind.REQUIRED  # type: ignore[union-attr]
    assert REG.get("proc.name").arg is ArgKind.NONE  # type: ignore[union-attr]
    assert REG.get("fd.sip").type is FieldType.IPADDR  # type: ignore[union-attr]
    assert REG.get("fd.snet").type is FieldType.IPNET  # type: ignore[union-attr]


def test_open_fields() -> None:
    e = open_event(flags=0o2000000)
    assert get(e, "evt.type") == "openat"
    assert get(e, "evt.is_open_read") is True
    assert get(e, "evt.is_open_write") is False
    assert get(e, "evt.arg", "flags") == "O_RDONLY|O_CLOEXEC"
    assert get(e, "evt.arg", "dirfd") == "-100(AT_FDCWD)"
    assert get(e, "evt.res") == "SUCCESS"
    assert get(e, "evt.rawres") == 3
    assert get(e, "fd.num") == 3
    assert get(e, "fd.typechar") == "f"
    assert get(e, "fd.name") == "/etc/shadow"
    assert get(e, "fd.directory") == "/etc"
    assert get(e, "fd.filename") == "shadow"
    assert get(e, "evt.failed") is False
    assert "name=/etc/shadow" in str(get(e, "evt.args"))
    assert get(e, "evt.num") == 7
    assert re.fullmatch(r"\d\d:\d\d:\d\d\.123456789", str(get(e, "evt.time")))


def test_open_write_trunc_and_failure() -> None:
    e = open_event(flags=0o1 | 0o100 | 0o1000, res=-13)
    assert get(e, "evt.is_open_write") is True
    assert "O_TRUNC" in str(get(e, "evt.arg", "flags"))
    assert get(e, "evt.res") == "EACCES"
    assert get(e, "fd.num") == -1
    assert get(e, "evt.failed") is True
    e.args["mode"] = 0o755
    assert get(e, "evt.is_open_exec") is True


def test_process_chain() -> None:
    e = open_event()
    assert get(e, "proc.name") == "cat"
    assert get(e, "proc.cmdline") == "cat /etc/shadow"
    assert get(e, "proc.args") == "/etc/shadow"
    assert get(e, "proc.pname") == "bash"
    assert get(e, "proc.pcmdline") == "bash -i"
    assert get(e, "proc.pexepath") == "/bin/bash"
    assert get(e, "proc.aname", 0) == "cat"
    assert get(e, "proc.aname", 1) == "bash"
    assert get(e, "proc.aname", 2) == "sh"
    assert get(e, "proc.aname", 3) is None
    assert get(e, "proc.aname") == ["bash", "sh"]
    assert get(e, "proc.apid", 2) == 100
    assert get(e, "proc.aexepath", 2) == "/bin/sh"
    assert get(e, "proc.sname") == "sh"
    assert get(e, "proc.vpgid.name") == "bash"
    assert get(e, "proc.is_vpgid_leader") is False
    assert get(e, "proc.cwd") == "/root/"
    assert get(e, "proc.tty") == 34816
    assert get(e, "proc.duration") == 6_000_000_000
    assert "CAP_SYS_ADMIN" in str(get(e, "thread.cap_effective"))
    assert "sys_module" in str(get(e, "thread.cap_effective")).lower()


def test_cycle_in_parent_chain_terminates() -> None:
    a = Process(pid=1, name="a")
    b = Process(pid=2, name="b", parent=a)
    a.parent = b
    e = Event(type="execve", proc=b)
    assert get(e, "proc.aname") == ["a"]


def test_container_user_k8s() -> None:
    e = open_event()
    assert get(e, "container.id") == "a" * 12
    assert get(e, "container.full_id") == "a" * 64
    assert get(e, "container.image.repository") == "reg.io/team/img"
    assert get(e, "container.image.tag") == "1.2"
    assert get(e, "container.privileged") is False
    assert get(e, "container.label", "corral.workflow_id") == "wf-1"
    assert get(e, "user.name") == "root"
    assert get(e, "user.loginuid") == -1
    assert get(e, "group.name") == "root"
    assert get(e, "k8s.ns.name") is None
    host = Event(type="openat")
    assert get(host, "container.id") == "host"
    assert get(host, "container.image.repository") is None


def test_socket_fields() -> None:
    fd = FdInfo(num=3, type="ipv4", name="10.0.0.2:40000->93.184.216.34:443", sockfamily="ip",
                l4proto="tcp", lip="10.0.0.2", lport=40000, rip="93.184.216.34", rport=443,
                is_server=False, connected=True)  # fmt: skip
    e = Event(type="connect", res=0, args={"fd": 3}, fd=fd, proc=chain())
    assert get(e, "fd.typechar") == "4"
    assert get(e, "fd.sip") == "93.184.216.34"
    assert get(e, "fd.sport") == 443
    assert get(e, "fd.cip") == "10.0.0.2"
    assert get(e, "fd.lport") == 40000
    assert get(e, "fd.rport") == 443
    assert get(e, "fd.ip") == ["10.0.0.2", "93.184.216.34"]
    assert get(e, "fd.snet") == "93.184.216.34"
    assert get(e, "fd.l4proto") == "tcp"
    assert get(e, "fd.sockfamily") == "ip"
    assert get(e, "fd.sip.name") is None
    fd.is_server = True  # an accepted connection: the local end is the server
    assert get(e, "fd.sip") == "10.0.0.2"
    assert get(e, "fd.sport") == 40000


def test_arg_rendering() -> None:
    e = Event(type="ptrace", args={"request": 16, "pid": 5}, res=0, proc=chain())
    assert get(e, "evt.arg", "request") == "PTRACE_ATTACH"
    s = Event(type="socket", args={"domain": 17, "type": 3, "proto": 0}, res=3, proc=chain())
    assert get(s, "evt.arg", "domain") == "AF_PACKET"
    assert get(s, "evt.arg", "type") == "SOCK_RAW"
    assert get(s, "evt.arg", 0) == "AF_PACKET"
    assert get(s, "evt.arg", "missing") is None
    assert get(s, "evt.rawarg", "domain") == 17
    sym = Event(type="symlinkat", args={"target": "/etc/shadow", "linkdirfd": -100,
                                        "linkpath": "x"}, res=0)  # fmt: skip
    assert get(sym, "evt.arg", "target") == "/etc/shadow"
    assert get(Event(type="connect", res=-115), "evt.res") == "EINPROGRESS"


def test_fd_types_and_env() -> None:
    p = chain()
    p.fds = {0: FdInfo(num=0, type="ipv4"), 1: FdInfo(num=1, type="pipe")}
    p.env = {"HOME": "/root"}
    e = Event(type="dup2", proc=p, res=0)
    assert get(e, "fd.types", 0) == "ipv4"
    assert get(e, "fd.types") == ["ipv4", "pipe"]
    assert get(e, "proc.env", "HOME") == "/root"
