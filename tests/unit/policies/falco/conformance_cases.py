"""Falco conformance cases: rule text in, Falco's verdict out.

The cases in ``conformance/*.yaml`` are our own transcription of what Falco's
rule-loader unit tests (``unit_tests/engine/`` in falcosecurity/falco) and
libsinsp's filter parser and compiler tests check, written from knowledge of
Falco's behaviour case by case (no test code was copied, and the sources could
not be consulted while writing them). Each case has:

* ``name`` and ``rules`` (a rule file), ``condition`` (wrapped into one
  rule on ``evt.type = open``, for the filter cases) or ``parse`` (a
  condition checked for syntax only, fields need not exist);
* ``expect``: ``ok`` (loads, no warning), ``warning: LOAD_...`` (loads and
  warns that kind) or ``error: LOAD_ERR_...`` (the load fails with that kind);
* optionally ``divergence``: why this engine knowingly reaches another
  verdict (the test expects the failure and the pass rate counts it);
* optionally ``source``: ``falco`` when the case was checked against a stored
  copy of Falco's ``test_rule_loader.cpp`` or its rule reader/compiler source (read
  late in the work, cases re-written by hand), ``falco-0.44-notes`` when
  checked against the Falco 0.44.0 release notes; cases without it are from
  knowledge only; ``libs`` for inputs of a stored copy of libs'
  ``filter_parser.ut.cpp``.

Run this module to print the pass rate per file (``docs/policies.md`` quotes it):
``.venv/bin/python tests/unit/policies/falco/conformance_cases.py``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from policies.falco.engine import Ruleset
from policies.falco.fields import default_registry
from policies.falco.grammar import ConditionParseError, parse_condition
from policies.falco.loader import COMPILE_CONDITION, RuleLoadError, load_texts

CASES_DIR = Path(__file__).with_name("conformance")


@dataclass(frozen=True, slots=True)
class Case:
    file: str
    name: str
    rules: str  # a rule file, or for a parse case the bare condition
    expect: str  # "ok", "warning LOAD_...", "error LOAD_ERR_..."
    divergence: str | None = None
    source: str | None = None
    parse_only: bool = False

    @property
    def id(self) -> str:
        return f"{self.file}:{self.name}"


def _wrap(condition: str) -> str:
    # Block scalar so that no condition text needs YAML quoting.
    body = "\n".join(f"    {line}" for line in condition.splitlines())
    return (
        "- rule: conformance\n  desc: d\n  condition: >-\n    evt.type = open and (\n"
        f"{body}\n    )\n  output: out\n  priority: INFO\n"
    )


def _expect(raw: Any) -> str:
    if raw == "ok":
        return "ok"
    if isinstance(raw, dict) and len(raw) == 1:
        [(kind, code)] = raw.items()
        if kind in ("warning", "error"):
            return f"{kind} {code}"
    raise ValueError(f"bad expect {raw!r}: use ok, warning: CODE or error: CODE")


def load_cases(directory: Path = CASES_DIR) -> list[Case]:
    cases: list[Case] = []
    for path in sorted(directory.glob("*.yaml")):
        if path.stem.startswith("libs_"):  # run by test_falco_libs_conformance.py
            continue
        for raw in yaml.safe_load(path.read_text(encoding="utf-8")):
            if "parse" in raw:
                rules = raw["parse"]
            else:
                rules = raw["rules"] if "rules" in raw else _wrap(raw["condition"])
            case = Case(path.stem, raw["name"], rules, _expect(raw["expect"]),
                        raw.get("divergence"), raw.get("source"), "parse" in raw)  # fmt: skip
            cases.append(case)
    return cases


def verdict(case: Case) -> tuple[str, set[str]]:
    """("ok" | "error CODE", warning codes) as this engine loads the case."""
    if case.parse_only:
        try:
            parse_condition(case.rules)
        except ConditionParseError:
            return f"error {COMPILE_CONDITION}", set()
        return "ok", set()
    try:
        load = load_texts([(f"{case.name}.yaml", case.rules)])
        ruleset = Ruleset.build(load, default_registry(), strict=True)
    except RuleLoadError as err:
        return f"error {err.code}", set()
    return "ok", {w.code for w in ruleset.warnings}


def agrees(case: Case) -> bool:
    """Does this engine reach Falco's verdict?"""
    outcome, warnings = verdict(case)
    kind, _, code = case.expect.partition(" ")
    if kind == "error":
        return outcome == case.expect
    if kind == "warning":
        return outcome == "ok" and code in warnings
    return outcome == "ok" and not warnings


def pass_rates(cases: list[Case]) -> dict[str, tuple[int, int]]:
    """file -> (cases with Falco's verdict, cases)."""
    rates: dict[str, tuple[int, int]] = {}
    for case in cases:
        passed, total = rates.get(case.file, (0, 0))
        rates[case.file] = (passed + agrees(case), total + 1)
    return rates


def main() -> None:
    cases = load_cases()
    rates = pass_rates(cases)
    for file, (passed, total) in rates.items():
        print(f"{file:20s} {passed:4d}/{total:<4d} {100 * passed / total:5.1f}%")
    passed = sum(p for p, _ in rates.values())
    print(f"{'all':20s} {passed:4d}/{len(cases):<4d} {100 * passed / len(cases):5.1f}%")
    checked = [c for c in cases if c.source]
    agreeing = sum(agrees(c) for c in checked)
    print(f"checked against Falco sources: {len(checked)} ({agreeing} agree); "
          f"from knowledge: {len(cases) - len(checked)}")  # fmt: skip
    for case in cases:
        if not agrees(case):
            print(f"  differs: {case.id} (Falco: {case.expect}; {verdict(case)[0]})",
                  file=sys.stderr)  # fmt: skip


if __name__ == "__main__":
    main()
