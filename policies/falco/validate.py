"""Validate rule files against a field registry without raising.

``validate_files`` is what ``corral policy validate`` reports: per rule, is it
supported by this engine, unsupported (and why: unknown field, unsupported
source, unsupported operator), disabled, or in error; plus file-level load
errors and the loader's warnings, each one line with Falco's result code
(``LOAD_ERR_*`` for errors, ``LOAD_*`` for warnings) and ``file:line``.

A rule the engine cannot evaluate (a field this sensor does not serve) fails
validation like an error unless unsupported rules are allowed: the sensor
refuses to start with it. Rules of another source only warn, as in Falco.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from policies.falco.engine import RuleEntry, Ruleset, RuleStatus
from policies.falco.fieldapi import FieldRegistry
from policies.falco.loader import COMPILE_CONDITION, SYSCALL_SOURCE, RuleLoadError, load_files


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
    syscall: bool = True  # the syscall source (other sources are skipped, as by Falco)
    skip_if_unknown_filter: bool = False  # the author accepts the rule being skipped


@dataclass
class ValidationReport:
    rules: list[RuleReport] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    allow_unsupported: bool = False

    @property
    def unevaluable(self) -> list[RuleReport]:
        """Syscall rules the engine cannot evaluate (the sensor would refuse them)."""
        return [
            r
            for r in self.rules
            if r.status is RuleStatus.UNSUPPORTED and r.syscall and not r.skip_if_unknown_filter
        ]

    @property
    def ok(self) -> bool:
        """No load errors, no rule in error, and (unless allowed) none unevaluable."""
        if self.errors or any(r.status is RuleStatus.ERROR for r in self.rules):
            return False
        return self.allow_unsupported or not self.unevaluable

    def error_lines(self) -> list[str]:
        """Errors, then the unevaluable rules (as errors unless allowed), one line each."""
        kind = "warning" if self.allow_unsupported else "error"
        unsupported = [
            f"{kind}: {_where(r)}: rule '{r.name}': cannot be evaluated here: {r.reason} "
            f"({COMPILE_CONDITION})"
            for r in self.unevaluable
        ]
        return [f"error: {e}" for e in self.errors] + unsupported

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
            "unevaluable": [r.name for r in self.unevaluable],
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
        syscall=entry.info.source == SYSCALL_SOURCE,
        skip_if_unknown_filter=entry.info.skip_if_unknown_filter,
    )


def _where(r: RuleReport) -> str:
    return r.file if r.line is None else f"{r.file}:{r.line}"


def _coded(text: str, code: str) -> str:
    return f"{text} ({code})"


def validate_ruleset(ruleset: Ruleset, *, allow_unsupported: bool = False) -> ValidationReport:
    return ValidationReport(
        rules=[_report(e) for e in ruleset.entries],
        errors=[_coded(str(f), f.code) for f in ruleset.failures],
        warnings=[_coded(str(w), w.code) for w in ruleset.warnings],
        allow_unsupported=allow_unsupported,
    )


def validate_files(
    paths: Sequence[Path | str], registry: FieldRegistry, *, allow_unsupported: bool = False
) -> ValidationReport:
    """Load and compile leniently; a file that cannot be loaded is one load error."""
    try:
        load = load_files(paths)
    except RuleLoadError as e:
        return ValidationReport(errors=[_coded(str(e), e.code)])
    ruleset = Ruleset.build(load, registry, strict=False)
    return validate_ruleset(ruleset, allow_unsupported=allow_unsupported)
