"""Response rules: which Falco alert does what to an episode.

Detection (Falco rule files) and response (this file's YAML) are kept apart,
as falco-talon does: a policy author can retune what an alert *does* without
touching what it *detects*. The file is a YAML list of response rules::

    - name: Quarantine binary tampering
      match:
        rules: ["Write below binary dir in sandbox"]  # any of; "*" globs
        priority: ">=Error"                # =, ==, !=, <, <=, >, >= or a bare name
        tags: ["corral, mitre_persistence"] # any entry; comma-separated = all of
        output_fields: ["proc.name!=apk"]  # any entry; comma-separated = all of
        source: syscall
      actions:
        - action: quarantine
          parameters: {timeout_s: 600}
      continue: false                      # true: later rules are evaluated too
      dry_run: false                       # true: record a notify instead

An empty or absent ``match`` matches every alert. The first matching rule
decides unless it says ``continue: true``; among all rules that matched, the
strongest action wins (kill > quarantine > notify). A ``dry_run`` rule's
actions count as ``notify``, and the decision records what they would have done.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from contract.errors import CorralError
from contract.priority import Priority
from policies.alert import Alert

Action = Literal["kill", "quarantine", "notify"]
DecisionAction = Literal["kill", "quarantine", "notify", "none"]

ACTIONS: tuple[Action, ...] = ("kill", "quarantine", "notify")
STRENGTH: dict[str, int] = {"none": 0, "notify": 1, "quarantine": 2, "kill": 3}
DEFAULT_QUARANTINE_TIMEOUT_S = 600
DEFAULT_RESPONSES = Path(__file__).with_name("responses.yaml")


class ResponsePolicyError(CorralError):
    """A response rules file is invalid; the message names file, rule and reason."""


class Decision(BaseModel):
    """What to do about one alert; sent to the episode workflow with the alert."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    action: DecisionAction
    rule: str = Field(description="the Falco rule that raised the alert")
    response: list[str] = Field(default_factory=list, description="response rules matched")
    dry_run: bool = False
    parameters: dict[str, Any] = Field(default_factory=dict)


# --- matching --------------------------------------------------------------

_PRIORITY_RE = re.compile(r"^\s*(>=|<=|==|!=|=|>|<)?\s*([A-Za-z]+)\s*$")
_FIELD_RE = re.compile(r"^\s*([^=!\s]+)\s*(!=|=)\s*(.*?)\s*$")


@dataclass(frozen=True, slots=True)
class PriorityTest:
    op: str
    priority: Priority

    @classmethod
    def parse(cls, text: str) -> PriorityTest:
        m = _PRIORITY_RE.match(text)
        if not m:
            raise ValueError(f"bad priority comparison {text!r} (e.g. '>=Critical')")
        return cls(op=m.group(1) or "=", priority=Priority.parse(m.group(2)))

    def __call__(self, p: Priority) -> bool:
        a, b = p.severity, self.priority.severity
        return {
            "=": a == b, "==": a == b, "!=": a != b,
            ">": a > b, ">=": a >= b, "<": a < b, "<=": a <= b,
        }[self.op]  # fmt: skip


@dataclass(frozen=True, slots=True)
class FieldTest:
    key: str
    equal: bool
    value: str

    def __call__(self, fields: dict[str, Any]) -> bool:
        # Falco's output_fields hold JSON scalars; compare as text, as written.
        present = self.key in fields and fields[self.key] is not None
        same = present and _as_text(fields[self.key]) == self.value
        return same if self.equal else not same


def _as_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _all_hold(tests: tuple[FieldTest, ...], fields: dict[str, Any]) -> bool:
    return all(t(fields) for t in tests)


def _split_all_of(entry: str) -> list[str]:
    return [part.strip() for part in entry.split(",") if part.strip()]


def _parse_field_entry(entry: str) -> tuple[FieldTest, ...]:
    tests = []
    for part in _split_all_of(entry):
        m = _FIELD_RE.match(part)
        if not m:
            raise ValueError(f"bad output_fields test {part!r} (want 'key=value' or 'key!=value')")
        tests.append(FieldTest(key=m.group(1), equal=m.group(2) == "=", value=m.group(3)))
    return tuple(tests)


class Match(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rules: list[str] = Field(default_factory=list)
    priority: str | None = None
    tags: list[str] = Field(default_factory=list)
    output_fields: list[str] = Field(default_factory=list)
    source: str | None = None

    @field_validator("priority")
    @classmethod
    def _priority(cls, value: str | None) -> str | None:
        if value is not None:
            PriorityTest.parse(value)
        return value

    @field_validator("output_fields")
    @classmethod
    def _fields(cls, value: list[str]) -> list[str]:
        for entry in value:
            _parse_field_entry(entry)
        return value

    def compile(self) -> _CompiledMatch:
        return _CompiledMatch(
            rules=tuple(self.rules),
            priority=PriorityTest.parse(self.priority) if self.priority else None,
            tags=tuple(frozenset(_split_all_of(e)) for e in self.tags),
            fields=tuple(_parse_field_entry(e) for e in self.output_fields),
            source=self.source,
        )


@dataclass(frozen=True, slots=True)
class _CompiledMatch:
    rules: tuple[str, ...]
    priority: PriorityTest | None
    tags: tuple[frozenset[str], ...]
    fields: tuple[tuple[FieldTest, ...], ...]
    source: str | None

    def __call__(self, alert: Alert) -> bool:
        return (
            self._rule_ok(alert.rule)
            and (self.priority is None or self.priority(alert.priority))
            and (not self.tags or any(t <= set(alert.tags) for t in self.tags))
            and (not self.fields or any(_all_hold(e, alert.output_fields) for e in self.fields))
            and (self.source is None or self.source == alert.source)
        )

    def _rule_ok(self, name: str) -> bool:
        if not self.rules:
            return True
        # Only names with "*" are patterns: rule names may contain "[" and "?".
        return any(fnmatch.fnmatchcase(name, r) if "*" in r else name == r for r in self.rules)


# --- rules -----------------------------------------------------------------


class ActionSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    action: Action
    parameters: dict[str, Any] = Field(default_factory=dict)

    def effective_parameters(self) -> dict[str, Any]:
        if self.action == "quarantine":
            return {"timeout_s": DEFAULT_QUARANTINE_TIMEOUT_S, **self.parameters}
        return dict(self.parameters)


# Parameters each action understands; notify passes anything through (to
# whoever records it), the others are strict so a typo is caught at load.
_ALLOWED_PARAMETERS: dict[str, set[str] | None] = {
    "kill": {"reason"},
    "quarantine": {"timeout_s", "reason"},
    "notify": None,
}


class ResponseRule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: str = Field(min_length=1)
    description: str = ""
    match: Match = Field(default_factory=Match)
    actions: list[ActionSpec] = Field(min_length=1)
    continue_: bool = Field(default=False, alias="continue")
    dry_run: bool = False

    @field_validator("actions", mode="before")
    @classmethod
    def _bare_names(cls, value: object) -> object:
        # "- kill" is shorthand for "- action: kill".
        if isinstance(value, list):
            return [{"action": v} if isinstance(v, str) else v for v in value]
        return value

    @field_validator("actions")
    @classmethod
    def _parameters(cls, value: list[ActionSpec]) -> list[ActionSpec]:
        for spec in value:
            allowed = _ALLOWED_PARAMETERS[spec.action]
            unknown = set(spec.parameters) - allowed if allowed is not None else set()
            if unknown:
                raise ValueError(
                    f"action {spec.action} has unknown parameter(s) {', '.join(sorted(unknown))}"
                    f" (allowed: {', '.join(sorted(allowed or ())) or 'none'})"
                )
            timeout = spec.parameters.get("timeout_s")
            if timeout is not None and (
                isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0
            ):
                raise ValueError(f"quarantine timeout_s must be a positive number, got {timeout!r}")
        return value


@dataclass(frozen=True, slots=True)
class _Contribution:
    response: str
    action: Action  # after dry_run
    intended: Action  # before dry_run
    parameters: dict[str, Any]


class ResponsePolicy:
    """An ordered list of response rules; :meth:`decide` maps an alert to a Decision."""

    def __init__(self, rules: Sequence[ResponseRule], source: str = "<memory>") -> None:
        self.rules = list(rules)
        self.source = source
        self._matchers = [r.match.compile() for r in self.rules]

    def decide(self, alert: Alert) -> Decision:
        contributions = self._contributions(alert)
        if not contributions:
            return Decision(action="none", rule=alert.rule)
        # max() keeps the first of equals: earlier rules win ties.
        best = max(contributions, key=lambda c: STRENGTH[c.action])
        softened = [c for c in contributions if STRENGTH[c.intended] > STRENGTH[best.action]]
        params = dict(best.parameters)
        if softened:
            would = max(softened, key=lambda c: STRENGTH[c.intended])
            params.update(would.parameters)
            params["dry_run_action"] = would.intended
        names = list(dict.fromkeys(c.response for c in contributions))
        return Decision(
            action=best.action,
            rule=alert.rule,
            response=names,
            dry_run=bool(softened),
            parameters=params,
        )

    def _contributions(self, alert: Alert) -> list[_Contribution]:
        out: list[_Contribution] = []
        for rule, matcher in zip(self.rules, self._matchers, strict=True):
            if not matcher(alert):
                continue
            for spec in rule.actions:
                action: Action = "notify" if rule.dry_run else spec.action
                params = spec.effective_parameters()
                out.append(_Contribution(rule.name, action, spec.action, params))
            if not rule.continue_:
                break
        return out


# --- loading ---------------------------------------------------------------


def load_responses(path: str | Path = DEFAULT_RESPONSES) -> ResponsePolicy:
    """Load a response rules file; raise :class:`ResponsePolicyError` on bad input."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ResponsePolicyError(f"{p}: cannot read: {exc.strerror or exc}") from None
    return parse_responses(text, source=str(p))


def parse_responses(text: str, source: str = "<string>") -> ResponsePolicy:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" line {where.line + 1}" if where is not None else ""
        raise ResponsePolicyError(f"{source}:{line} not valid YAML: {_yaml_problem(exc)}") from None
    if data is None:
        data = []
    if not isinstance(data, list):
        raise ResponsePolicyError(
            f"{source}: must be a YAML list of response rules, got {type(data).__name__}"
        )
    rules = [_parse_rule(item, i, source) for i, item in enumerate(data)]
    _check_unique(rules, source)
    return ResponsePolicy(rules, source=source)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    return str(getattr(exc, "problem", None) or exc).splitlines()[0]


def _parse_rule(item: object, index: int, source: str) -> ResponseRule:
    label = _label(item, index)
    if not isinstance(item, dict):
        kind = type(item).__name__
        raise ResponsePolicyError(f"{source}: {label}: must be a mapping, got {kind}")
    try:
        return ResponseRule.model_validate(item)
    except ValidationError as exc:
        raise ResponsePolicyError(f"{source}: {label}: {_explain(exc)}") from None


def _label(item: object, index: int) -> str:
    name = item.get("name") if isinstance(item, dict) else None
    return f"rule {name!r}" if isinstance(name, str) and name else f"rule #{index + 1}"


def _explain(exc: ValidationError) -> str:
    # A misspelt key shows up as both unknown and missing: name the typo.
    err = min(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
    loc = ".".join(str(p) for p in err["loc"])
    kind = err["type"]
    if kind == "extra_forbidden":
        return f"unknown key {loc!r}"
    if kind == "missing":
        return f"missing key {loc!r}"
    if kind == "literal_error" and loc.endswith("action"):
        return f"unknown action {err['input']!r} (one of {', '.join(ACTIONS)})"
    msg = str(err["msg"]).removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc else msg


def _check_unique(rules: list[ResponseRule], source: str) -> None:
    seen: set[str] = set()
    for rule in rules:
        if rule.name in seen:
            raise ResponsePolicyError(f"{source}: rule {rule.name!r}: defined twice")
        seen.add(rule.name)
