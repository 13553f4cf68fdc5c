"""Policy test cases: commands run in a real sandbox, and the alerts they must raise.

``corral policy test DIR`` (the CLI) loads every ``*.yaml`` file in DIR with
:func:`load_test_cases`, runs each case's commands in a fresh sandbox of its
image with the rules loaded, collects the alerts raised for that sandbox and
checks them with :func:`compare`. A file holds one case (a mapping) or several
(a list of mappings)::

    name: write below /bin is caught
    image: busybox               # default
    commands:                    # shell strings, run in order with `sh -c`
      - echo x > /bin/corral-test
    expect:
      alerts: [Write below binary dir in sandbox]   # [] means: no alert at all

The comparison is on rule names, as a set: every expected rule must have
fired, and no other rule may have (repeats of an expected rule are fine).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from contract.errors import CorralError
from policies.alert import Alert


class PolicyTestError(CorralError):
    """A policy test file is invalid; the message names the file, case and reason."""


class Expectation(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    alerts: list[str]


class PolicyTestCase(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    description: str = ""
    image: str = "busybox"
    commands: list[str] = Field(min_length=1)
    expect: Expectation
    # How long to wait after the last command for alerts still in flight.
    settle_s: float = Field(default=2.0, ge=0)
    file: str = Field(default="", exclude=True)

    def check(self, got: Iterable[Alert | str]) -> CaseResult:
        return compare(self.expect, got, name=self.name)


class CaseResult(BaseModel):
    name: str = ""
    passed: bool
    expected: list[str]
    got: list[str]
    missing: list[str]
    unexpected: list[str]

    def summary(self) -> str:
        """One line, for the CLI."""
        if self.passed:
            return f"PASS {self.name}"
        parts = []
        if self.missing:
            parts.append(f"missing {', '.join(self.missing)}")
        if self.unexpected:
            parts.append(f"unexpected {', '.join(self.unexpected)}")
        return f"FAIL {self.name}: {'; '.join(parts)}"


def compare(
    expected: Expectation | Sequence[str], got: Iterable[Alert | str], name: str = ""
) -> CaseResult:
    """Compare rule names: all expected fired, nothing else did."""
    want = expected.alerts if isinstance(expected, Expectation) else list(expected)
    seen = [a.rule if isinstance(a, Alert) else a for a in got]
    fired = list(dict.fromkeys(seen))
    missing = [r for r in dict.fromkeys(want) if r not in fired]
    unexpected = [r for r in fired if r not in want]
    return CaseResult(
        name=name,
        passed=not missing and not unexpected,
        expected=list(want),
        got=fired,
        missing=missing,
        unexpected=unexpected,
    )


def load_test_cases(directory: str | Path) -> list[PolicyTestCase]:
    """Every case in ``directory/*.yaml`` (sorted by file name, then file order)."""
    root = Path(directory)
    if not root.is_dir():
        raise PolicyTestError(f"{root}: not a directory")
    files = sorted([*root.glob("*.yaml"), *root.glob("*.yml")])
    if not files:
        raise PolicyTestError(f"{root}: no *.yaml test cases")
    cases = [case for f in files for case in _load_file(f)]
    _check_unique(cases)
    return cases


def _load_file(path: Path) -> list[PolicyTestCase]:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise PolicyTestError(f"{path}: cannot read: {first}") from None
    items = data if isinstance(data, list) else [data]
    return [_parse_case(item, i, path) for i, item in enumerate(items)]


def _parse_case(item: object, index: int, path: Path) -> PolicyTestCase:
    name = item.get("name") if isinstance(item, dict) else None
    label = f"case {name!r}" if isinstance(name, str) and name else f"case #{index + 1}"
    if not isinstance(item, dict):
        raise PolicyTestError(f"{path}: {label}: must be a mapping")
    try:
        return PolicyTestCase.model_validate({**item, "file": str(path)})
    except ValidationError as exc:
        raise PolicyTestError(f"{path}: {label}: {_explain(exc)}") from None


def _explain(exc: ValidationError) -> str:
    # A misspelt key shows up as both unknown and missing: name the typo.
    err = min(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
    loc = ".".join(str(p) for p in err["loc"])
    if err["type"] == "extra_forbidden":
        return f"unknown key {loc!r}"
    if err["type"] == "missing":
        return f"missing key {loc!r}"
    return f"{loc}: {err['msg']}"


def _check_unique(cases: list[PolicyTestCase]) -> None:
    seen: dict[str, str] = {}
    for case in cases:
        if case.name in seen:
            raise PolicyTestError(
                f"{case.file}: case {case.name!r}: name already used in {seen[case.name]}"
            )
        seen[case.name] = case.file
