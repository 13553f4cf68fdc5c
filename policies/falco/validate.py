"""Validate rule files against a field registry without raising.

``validate_files`` is what ``corral policy validate`` reports: per rule, is it
supported by this engine, unsupported (and why: unknown field, unsupported
source, unsupported operator), disabled, or in error; plus file-level load
errors and the loader's warnings.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from policies.falco.engine import RuleEntry, Ruleset, RuleStatus
from policies.falco.fieldapi import FieldRegistry
from policies.falco.loader import RuleLoadError, load_files


@dataclass(frozen=True, slots=True)
class RuleReport:
    name: str
    status: RuleStatus
    reason: str | None
    file: str
    line: int | None
    priority: str
    event_types: list[str] | None  # None: every event type (or all but some)
    missing_fields: list[str]
    missing_output_fields: list[str]


@dataclass
class ValidationReport:
    rules: list[RuleReport] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No load errors and no rule in error (unsupported rules are not errors)."""
        return not self.errors and all(r.status is not RuleStatus.ERROR for r in self.rules)

    def counts(self) -> dict[str, int]:
        found = Counter(r.status.value for r in self.rules)
        return {s.value: found.get(s.value, 0) for s in RuleStatus}

    def missing_fields(self) -> dict[str, list[str]]:
        """Unknown field -> the rules that need it."""
        out: dict[str, list[str]] = {}
        for r in self.rules:
            for f in r.missing_fields:
                out.setdefault(f, []).append(r.name)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "counts": self.counts(),
            "rules": [asdict(r) | {"status": r.status.value} for r in self.rules],
            "errors": list(self.errors),
            "warnings": list(self.warnings),
        }


def _report(entry: RuleEntry) -> RuleReport:
    types = entry.event_types
    return RuleReport(
        name=entry.name,
        status=entry.status,
        reason=entry.reason,
        file=entry.info.ctx.file,
        line=entry.info.ctx.line,
        priority=entry.info.priority.falco_name,
        event_types=sorted(types.names) if types.finite else None,
        missing_fields=list(entry.missing_fields),
        missing_output_fields=sorted(set(entry.output.unknown_fields)) if entry.output else [],
    )


def validate_ruleset(ruleset: Ruleset) -> ValidationReport:
    return ValidationReport(
        rules=[_report(e) for e in ruleset.entries],
        errors=list(ruleset.errors),
        warnings=[str(w) for w in ruleset.warnings],
    )


def validate_files(paths: Sequence[Path | str], registry: FieldRegistry) -> ValidationReport:
    """Load and compile leniently; a file that cannot be loaded is one load error."""
    try:
        load = load_files(paths)
    except RuleLoadError as e:
        return ValidationReport(errors=[str(e)])
    return validate_ruleset(Ruleset.build(load, registry, strict=False))
