"""Falco 0.44 rule syntax: oneof/anyof/allof modifiers and join/concat/getopt."""

from __future__ import annotations

import pytest
from falco_testkit import engine, matches, rule

from policies.falco.calls import scan_options
from policies.falco.evttypes import EventTypes, event_types
from policies.falco.grammar import parse_condition

EV = {"evt.type": "open", "proc.name": "kube-proxy", "proc.cmdline": "curl x | bash"}


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        ("proc.name startswith anyof (ssh, kube-)", True),
        ("proc.name startswith anyof (ssh, etcd-)", False),
        ("proc.name startswith oneof (kube, kube-)", False),  # two match: not exactly one
        ("proc.name startswith oneof (kube-, etcd-)", True),
        ("proc.cmdline contains allof (curl, bash)", True),
        ("proc.cmdline contains allof (curl, wget)", False),
        ("proc.name = anyof (sshd, kube-proxy)", True),
        ("proc.name != allof (sshd, sudo)", True),
        ("proc.name != allof (sshd, kube-proxy)", False),
        ("proc.name = anyof ()", False),  # an empty list never matches
        ("not proc.name != anyof ()", True),
        ("fd.name startswith anyof (/etc)", False),  # no value: false, as every comparison
    ],
)
def test_modifier_semantics(condition: str, expected: bool) -> None:
    assert matches(condition, EV) is expected


def test_modifier_event_types_index() -> None:
    def types(cond: str) -> EventTypes:
        return event_types(parse_condition(cond))

    assert types("evt.type = anyof (open, openat)") == EventTypes(frozenset({"open", "openat"}))
    assert types("evt.type != allof (open, openat)").complement
    # "!= anyof" holds for every type once two names differ: no restriction.
    assert types("evt.type != anyof (open, openat)").is_all


def test_modifier_in_a_single_field_exception() -> None:
    text = rule("r", "evt.type = open") + (
        "  exceptions:\n    - name: trusted\n      fields: proc.name\n"
        "      comps: startswith anyof\n      values: [kube-, etcd-]\n"
    )
    eng = engine(text)
    assert eng.ruleset.entries[0].condition_text.endswith(
        "and not (proc.name startswith anyof (kube-, etcd-))"
    )
    assert eng.evaluate(EV) == []
    assert [m.rule for m in eng.evaluate({**EV, "proc.name": "bash"})] == ["r"]


def test_join_and_concat() -> None:
    ev = {**EV, "proc.aname": ["bash", "sshd"], "proc.pname": "bash"}
    assert matches('join(",", proc.aname) = "bash,sshd"', ev)
    assert matches('concat(proc.pname, "/", proc.name) = bash/kube-proxy', ev)
    assert matches("len(concat(proc.pname, proc.name)) = 14", ev)
    assert not matches("concat(proc.pname, fd.name) exists", ev)  # a missing part: no value


def test_getopt() -> None:
    ev = {**EV, "proc.aname": ["-nt", "30", "-x", "--long", "-v", "file", "-q"]}
    assert matches('getopt(proc.aname, "nt:v")[t] = 30', ev)
    assert matches('getopt(proc.aname, "nt:v")[v] = v', ev)  # an option without value: its name
    assert matches('getopt(proc.aname, "nt:v") intersects (n, t, 30, "?")', ev)
    assert not matches('getopt(proc.aname, "nt:v")[q] exists', ev)  # after the operand


def test_scan_options_follows_getopt() -> None:
    argv = ["-ab", "-cval", "-c", "next", "--", "-a"]
    found = scan_options(argv, "abc:")
    assert [(o.name, o.value) for o in found] == [("a", None), ("b", None), ("c", "val"),
                                                   ("c", "next")]  # fmt: skip
    assert scan_options(["operand", "-a"], "a") == []
    assert [o.name for o in scan_options(["--exec", "-x", "-a"], "a")] == ["?", "a"]
    assert scan_options(["-c"], ":c:") == [("c", "", True)]  # missing argument
