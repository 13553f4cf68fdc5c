"""Explain a rule: its condition with macros, lists and exceptions inlined.

``corral policy explain`` prints this so a policy author can see what the
engine actually evaluates, which fields it reads and which event types
(syscalls) the rule is indexed under.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from policies.falco.engine import Ruleset, RuleStatus
from policies.falco.grammar import to_text
from policies.falco.loader import RuleLoadError


@dataclass(frozen=True, slots=True)
class ExceptionSummary:
    name: str
    fields: str | list[str] | None
    comps: str | list[str] | None
    values: list[Any]


@dataclass(frozen=True, slots=True)
class Explanation:
    name: str
    status: RuleStatus
    reason: str | None
    source: str
    priority: str
    tags: list[str]
    enabled: bool
    condition: str  # as written (after overrides)
    condition_with_exceptions: str
    expanded_condition: str | None  # macros and lists inlined; None if it did not parse
    fields: list[str]
    missing_fields: list[str]
    event_types: list[str] | None  # None: not a finite set
    event_types_text: str
    macros: list[str]
    lists: list[str]
    exceptions: list[ExceptionSummary]
    output: str
    output_fields: list[str]
    file: str
    line: int | None


def explain_rule(ruleset: Ruleset, name: str) -> Explanation:
    entry = ruleset.get(name)
    if entry is None:
        raise RuleLoadError(f"no rule named '{name}'")
    info = entry.info
    exp = entry.expansion
    types = entry.event_types
    return Explanation(
        name=info.name,
        status=entry.status,
        reason=entry.reason,
        source=info.source,
        priority=info.priority.falco_name,
        tags=list(info.tags),
        enabled=info.enabled,
        condition=info.condition,
        condition_with_exceptions=entry.condition_text,
        expanded_condition=to_text(exp.node) if exp else None,
        fields=entry.fields,
        missing_fields=list(entry.missing_fields),
        event_types=sorted(types.names) if types.finite else None,
        event_types_text=types.describe(),
        macros=sorted(exp.macros) if exp else [],
        lists=sorted(exp.lists) if exp else [],
        exceptions=[
            ExceptionSummary(e.name, e.fields, e.comps, list(e.values)) for e in info.exceptions
        ],
        output=info.output,
        output_fields=[f.key for f in entry.output.fields] if entry.output else [],
        file=info.ctx.file,
        line=info.ctx.line,
    )
