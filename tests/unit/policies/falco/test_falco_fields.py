"""Fields added for Falco fidelity: container.mount* (from the OCI spec),
fs.path.*, evt.type.is, and Falco fields this sensor refuses by name."""

from __future__ import annotations

from typing import Any

import pytest

from policies.falco.engine import RuleEngine
from policies.falco.event import ContainerInfo, Event, FdInfo, Process, mounts_from_spec
from policies.falco.fields import default_registry
from policies.falco.loader import UnknownFieldError

SPEC_MOUNTS: list[dict[str, Any]] = [
    {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid"]},
    {"destination": "/host/docker.sock", "type": "bind", "source": "/var/run/docker.sock",
     "options": ["rbind", "ro", "rslave"]},
    {"destination": "/work", "type": "bind", "source": "/srv/work", "options": ["rbind"]},
]  # fmt: skip


def _rule(condition: str, output: str = "x") -> str:
    return (
        f"- rule: r\n  desc: d\n  condition: {condition}\n  output: '{output}'\n  priority: INFO\n"
    )


def _values(output: str, event: Event) -> str:
    eng = RuleEngine.from_texts([("t.yaml", _rule("evt.type = execve", output))],
                                default_registry())  # fmt: skip
    [match] = eng.evaluate(event)
    return match.output


def _exec(mounts: list[dict[str, Any]]) -> Event:
    container = ContainerInfo(full_id="a" * 64, mounts=mounts_from_spec(mounts))
    return Event(type="execve", proc=Process(pid=1, name="sh", cwd="/w"), container=container)


def test_container_mounts_from_the_spec() -> None:
    ev = _exec(SPEC_MOUNTS)
    assert (
        _values("%container.mount[1]", ev)
        == "/var/run/docker.sock:/host/docker.sock:ro:true:rslave"
    )
    assert _values("%container.mount.dest[/var/run/*.sock]", ev) == "/host/docker.sock"
    assert _values("%container.mount.source[/work]", ev) == "/srv/work"
    assert _values("%container.mount.rdonly[/srv/work]", ev) == "false"
    assert _values("%container.mount[/nothing]", ev) == "none"
    assert _values("%container.mount.dest[/nothing]", ev) == "<NA>"
    assert _values("%container.mounts", ev).startswith("proc:/proc:rw:false:rprivate ")


def test_upstream_sensitive_mount_style_condition() -> None:
    cond = 'evt.type = execve and not container.mount.dest[/var/run/docker.sock] in ("<NA>")'
    eng = RuleEngine.from_texts([("t.yaml", _rule(cond))], default_registry())
    assert [m.rule for m in eng.evaluate(_exec(SPEC_MOUNTS))] == ["r"]
    # No such mount: the field has no value, so "not ... in" holds, as in libsinsp.
    assert [m.rule for m in eng.evaluate(_exec([]))] == ["r"]


def test_fs_path_fields_resolve_against_cwd() -> None:
    ev = Event(type="renameat2", args={"oldpath": "a", "newpath": "/b"},
               proc=Process(pid=1, name="mv", cwd="/w/"))  # fmt: skip
    eng = RuleEngine.from_texts(
        [("t.yaml", _rule("evt.type.is[renameat2] = 1", "%fs.path.source %fs.path.target"))],
        default_registry(),
    )
    [match] = eng.evaluate(ev)
    assert match.output == "/w/a /b"


def test_unserved_falco_field_is_refused_by_name() -> None:
    with pytest.raises(UnknownFieldError, match=r"thread\.cpu.*cannot serve"):
        RuleEngine.from_texts([("t.yaml", _rule("evt.type = open and thread.cpu > 1"))],
                              default_registry())  # fmt: skip


@pytest.mark.parametrize(
    ("condition", "expected"),
    [  # the comparisons of libs' net compare test, on a connect to 142.251.111.147:443
        ("fd.ip == 142.251.111.147", True),
        ("fd.sip == 142.251.111.147", True),
        ("fd.rip == 142.251.111.147", True),
        ("fd.cip == 172.40.111.222", True),
        ("fd.ip != 142.251.111.147", False),
        ("fd.sip != 0:0:0:0:0:0:0:1", True),
        ("fd.sip == '0:0:0:0:0:0:0:1'", False),
        ("fd.net == 142.0.0.0/4", True),
        ("fd.net == 142.251.0.0/8", True),
        ("fd.net != 10.0.0.0/8", True),
        ("fd.net != 2001:db8:abcd:0012::0/64", True),
        ("fd.net == 10.0.0.0/8", False),
        ("fd.snet == 2001:db8:abcd:0012::0/64", False),
    ],
)
def test_net_compare_like_libs(condition: str, expected: bool) -> None:
    fd = FdInfo(num=9, type="ipv4", sockfamily="ip", l4proto="tcp", lip="172.40.111.222",
                lport=54321, rip="142.251.111.147", rport=443, is_server=False)  # fmt: skip
    ev = Event(type="connect", proc=Process(pid=1, name="curl"), fd=fd)
    text = _rule(f"evt.type = connect and {condition}".replace("'", "''"))
    text = text.replace("condition: ", "condition: '", 1).replace("\n  output", "'\n  output", 1)
    eng = RuleEngine.from_texts([("t.yaml", text)], default_registry())
    assert bool(eng.evaluate(ev)) is expected
