"""Output templates and the Match an alert is built from."""

from __future__ import annotations

from falco_testkit import engine, registry, rule

from contract.priority import Priority
from policies.falco.engine import Match
from policies.falco.output import OutputTemplate


def test_render_fields_args_and_missing() -> None:
    tpl = OutputTemplate(
        "Shell (user=%user.name gp=%proc.aname[2] flags=%evt.arg.flags fd=%fd.num x=%k8s.pod.name)",
        registry(),
    )
    ev = {"user.name": "root", "proc.aname[2]": "sshd", "evt.arg[flags]": "O_RDONLY", "fd.num": 3}
    assert tpl.render(ev) == "Shell (user=root gp=sshd flags=O_RDONLY fd=3 x=<NA>)"
    assert tpl.unknown_fields == ["k8s.pod.name"]
    assert tpl.render({}) == "Shell (user=<NA> gp=<NA> flags=<NA> fd=<NA> x=<NA>)"


def test_render_values_like_falco() -> None:
    tpl = OutputTemplate("%evt.is_open_write %proc.aname %10proc.name| 100%", registry())
    ev = {"evt.is_open_write": True, "proc.aname": ["sh", "sshd"], "proc.name": "cat"}
    assert tpl.render(ev) == "true (sh,sshd) cat       | 100%"


def test_transformer_in_output() -> None:
    tpl = OutputTemplate("n=%toupper(proc.name)!", registry())
    assert tpl.render({"proc.name": "cat"}) == "n=CAT!"


def test_match_carries_output_fields_and_always_fields() -> None:
    eng = engine(
        rule(
            "Shell",
            "evt.type = execve",
            output="'shell %proc.name by %user.uid'",
            priority="NOTICE",
        )
        + "  tags: [shell, container]\n"
    )
    ev = {
        "evt.type": "execve",
        "proc.name": "bash",
        "user.uid": 0,
        "container.id": "abc",
        "proc.cmdline": "bash -i",
        "proc.pid": 42,
    }
    [m] = eng.evaluate(ev)
    assert isinstance(m, Match)
    assert (m.rule, m.priority, m.priority_name, m.source) == (
        "Shell",
        Priority.NOTICE,
        "Notice",
        "syscall",
    )
    assert m.tags == ("container", "shell")
    assert m.output == "shell bash by 0"
    assert m.output_fields == {
        "proc.name": "bash",
        "user.uid": 0,
        "container.id": "abc",
        "container.full_id": None,
        "proc.cmdline": "bash -i",
        "proc.pid": 42,
    }


def test_falco_json_shape() -> None:
    m = Match("R", Priority.WARNING, ("a",), "hello", {"proc.pid": 1})
    body = m.falco_json(1_700_000_000_123_456_789, "node-1")
    assert body["output"] == "22:13:20.123456789: Warning hello"
    assert body["time"] == "2023-11-14T22:13:20.123456789Z"
    assert (body["priority"], body["rule"], body["hostname"]) == ("Warning", "R", "node-1")
    assert body["output_fields"] == {"proc.pid": 1} and body["tags"] == ["a"]
