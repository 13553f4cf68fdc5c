"""Event-type indexing: which evt.type values each rule can match."""

from __future__ import annotations

import pytest
from falco_testkit import engine, rule, ruleset

from policies.falco.compiler import EventTypes, event_types
from policies.falco.grammar import parse_condition


def types(cond: str) -> EventTypes:
    return event_types(parse_condition(cond))


@pytest.mark.parametrize(
    ("cond", "names", "complement"),
    [
        ("evt.type = open", {"open"}, False),
        ("evt.type in (open, openat) and proc.name = x", {"open", "openat"}, False),
        ("evt.type = open or evt.type = connect", {"open", "connect"}, False),
        ("evt.type in (open, openat) and evt.type = openat", {"openat"}, False),
        ("evt.type = open and evt.type = connect", set(), False),
        ("proc.name = x", set(), True),
        ("evt.type != open", {"open"}, True),
        ("not evt.type = open", {"open"}, True),
        ("evt.type = open or proc.name = x", set(), True),
        # a negated conjunction can still be true on open events: must stay "all"
        ("not (evt.type = open and proc.name = x)", set(), True),
        ("not (evt.type = open or evt.type = close)", {"open", "close"}, True),
        ("not not evt.type = open", {"open"}, False),
        ("evt.type contains open", set(), True),  # only =, !=, in are understood
    ],
)
def test_event_types(cond: str, names: set[str], complement: bool) -> None:
    assert types(cond) == EventTypes(frozenset(names), complement)


def test_macros_and_lists_feed_the_index() -> None:
    rs = ruleset(
        "- list: opens\n  items: [open, openat]\n"
        "- macro: open_any\n  condition: evt.type in (opens)\n"
        + rule("A", "open_any and proc.name = a")
        + rule("B", "evt.type = execve")
        + rule("C", "evt.type != execve")
        + "  warn_evttypes: false\n"
    )
    assert rs.event_types() == frozenset({"open", "openat", "execve"})
    assert rs.unbounded_rules() == ["C"]
    assert [e.name for e in rs.rules_for("openat")] == ["A", "C"]
    assert [e.name for e in rs.rules_for("execve")] == ["B"]
    assert [e.name for e in rs.rules_for("close")] == ["C"]


def test_engine_only_evaluates_relevant_rules() -> None:
    eng = engine(rule("Exec", "evt.type = execve") + rule("Any", "proc.name = x"))
    assert [m.rule for m in eng.evaluate({"evt.type": "execve", "proc.name": "x"})] == [
        "Exec",
        "Any",
    ]
    assert [m.rule for m in eng.evaluate({"evt.type": "open", "proc.name": "x"})] == ["Any"]


def test_rule_without_event_type_warns() -> None:
    rs = ruleset(rule("Any", "proc.name = x"))
    assert any("every event type" in str(w) for w in rs.warnings)


def test_first_match_like_falco_by_default() -> None:
    rules = rule("One", "evt.type = execve") + rule("Two", "evt.type = execve")
    ev = {"evt.type": "execve"}
    assert [m.rule for m in engine(rules, rule_matching="first").evaluate(ev)] == ["One"]
    assert [m.rule for m in engine(rules, rule_matching="all").evaluate(ev)] == ["One", "Two"]
