"""Corral's rule file: shape, conventions, and that the rule engine loads it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from policies.responses import load_responses

RULES = Path(__file__).resolve().parents[3] / "policies" / "rules" / "corral_rules.yaml"
REQUIRED_OUTPUT = ("%container.id", "%container.full_id", "%proc.cmdline", "%proc.pid")
FIELD_PREFIXES = ("evt.", "proc.", "fd.", "user.", "container.")


def items() -> list[dict[str, Any]]:
    return list(yaml.safe_load(RULES.read_text()))


def rules() -> list[dict[str, Any]]:
    return [i for i in items() if "rule" in i]


@pytest.mark.parametrize("rule", rules(), ids=lambda r: r["rule"])
def test_rule_conventions(rule: dict[str, Any]) -> None:
    assert {"desc", "condition", "output", "priority", "tags"} <= set(rule)
    for field in REQUIRED_OUTPUT:
        assert field in rule["output"], field
    assert "corral" in rule["tags"]
    assert any(t.startswith("mitre_") for t in rule["tags"])
    assert rule["priority"] in {"CRITICAL", "ERROR", "WARNING", "NOTICE"}


def test_tuning_hooks_are_empty() -> None:
    for item in items():
        name = item.get("list") or item.get("macro") or ""
        if name.startswith("corral_allowed_"):
            assert item.get("items", []) == [] or item.get("condition") == "(corral_never_true)"


def test_loader_and_grammar_accept_the_file() -> None:
    pytest.importorskip("policies.falco.loader")
    from policies.falco.grammar import parse_condition
    from policies.falco.loader import load_files

    loaded = load_files([RULES])
    assert not loaded.warnings
    names = [r.name for r in _values(loaded.rules)]
    assert "Write below binary dir in sandbox" in names
    for item in [*_values(loaded.macros), *_values(loaded.rules)]:
        parse_condition(item.condition)


def _values(container: Any) -> list[Any]:
    return list(container.values()) if isinstance(container, dict) else list(container)


def test_validator_supports_every_rule_of_the_file() -> None:
    from policies.falco.fields import default_registry
    from policies.falco.validate import validate_files

    report = validate_files([RULES], default_registry())
    assert report.ok, report.errors
    unsupported = {r.name: r.reason for r in report.rules if r.status != "supported"}
    assert not unsupported
    assert len(report.rules) == len(rules())


def test_every_priority_has_a_response() -> None:
    from policies.alert import make_alert

    policy = load_responses()
    for rule in rules():
        alert = make_alert(
            rule=rule["rule"],
            priority=rule["priority"],
            output="o",
            output_fields={"container.id": "0" * 12},
            tags=rule["tags"],
        )
        assert policy.decide(alert).action != "none", rule["rule"]


def test_engine_compiles_the_file_strictly() -> None:
    engine_mod = pytest.importorskip("policies.falco.engine")
    fields_mod = pytest.importorskip("policies.falco.fields")
    engine = engine_mod.RuleEngine.from_files([RULES], fields_mod.default_registry(), strict=True)
    assert not engine.ruleset.warnings
    assert not engine.ruleset.unbounded_rules()  # every rule is indexed by evt.type
    assert {"open", "openat", "connect", "execve", "ptrace", "mount", "setns"} <= set(
        engine.event_types()
    )
