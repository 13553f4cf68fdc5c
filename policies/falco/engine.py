"""The rule engine: compiled rules indexed by event type, evaluated per event.

``Ruleset.build`` turns a ``LoadResult`` into one ``RuleEntry`` per rule with
a status (supported / unsupported / disabled / error). ``RuleEngine``
evaluates the supported ones. Like Falco, only the rules whose condition can
match the event's ``evt.type`` are evaluated, in definition order, and by
default (Falco's ``rule_matching: first``) evaluation stops at the first
rule that matches; ``rule_matching="all"`` reports every matching rule.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from contract.priority import Priority
from policies.falco.compiler import (
    EventTypes,
    Expander,
    Expansion,
    Getter,
    Predicate,
    compile_predicate,
    condition_with_exceptions,
    event_types,
    fields_used,
    iter_checks,
    macro_refs,
    make_getter,
    missing_fields,
    resolve_field,
    unresolved_fields,
)
from policies.falco.fieldapi import FieldRegistry
from policies.falco.grammar import (
    BinaryCheck,
    ConditionParseError,
    FieldRef,
    ListValue,
    Node,
    Value,
    field_ref,
)
from policies.falco.lint import condition_warnings
from policies.falco.loader import (
    COMPILE_CONDITION,
    COMPILE_CONDITION_WARNING,
    COMPILE_OUTPUT,
    DEPRECATED_ITEM,
    NO_EVTTYPE,
    SYSCALL_SOURCE,
    UNKNOWN_FILTER,
    UNSAFE_NA_CHECK,
    UNUSED_LIST,
    UNUSED_MACRO,
    VALIDATE,
    ExceptionInfo,
    LoadResult,
    LoadWarning,
    MacroInfo,
    RuleInfo,
    RuleLoadError,
    UnknownEventTypeError,
    UnsupportedOperatorError,
    load_files,
    load_texts,
)
from policies.falco.output import ExtraFields, OutputTemplate, json_value
from policies.falco.resolve import unknown_field

log = logging.getLogger(__name__)

RuleMatching = Literal["first", "all"]


class RuleStatus(StrEnum):
    SUPPORTED = "supported"
    UNSUPPORTED = "unsupported"
    DISABLED = "disabled"
    ERROR = "error"


@dataclass
class RuleEntry:
    """One rule after compilation, whatever became of it."""

    info: RuleInfo
    status: RuleStatus
    condition_text: str
    reason: str | None = None
    expansion: Expansion | None = None
    event_types: EventTypes = field(default_factory=EventTypes.all)
    missing_fields: list[str] = field(default_factory=list)
    predicate: Predicate | None = None
    output: OutputTemplate | None = None

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def fields(self) -> list[str]:
        return fields_used(self.expansion.node) if self.expansion else []


@dataclass(frozen=True, slots=True)
class Match:
    """One rule that matched one event: what an alert is made of."""

    rule: str
    priority: Priority
    tags: tuple[str, ...]
    output: str
    output_fields: dict[str, Any]
    source: str = SYSCALL_SOURCE

    @property
    def priority_name(self) -> str:
        return self.priority.falco_name

    def falco_json(self, time_ns: int, hostname: str) -> dict[str, Any]:
        """The body of Falco's ``json_output`` for this match (``time_ns``: event time)."""
        when = datetime.fromtimestamp(time_ns // 1_000_000_000, UTC)
        ns = time_ns % 1_000_000_000
        return {
            "hostname": hostname,
            "output": f"{when:%H:%M:%S}.{ns:09d}: {self.priority_name} {self.output}",
            "output_fields": dict(self.output_fields),
            "priority": self.priority_name,
            "rule": self.rule,
            "source": self.source,
            "tags": list(self.tags),
            "time": f"{when:%Y-%m-%dT%H:%M:%S}.{ns:09d}Z",
        }


class Ruleset:
    """Compiled rules plus what the loader and compiler had to say."""

    def __init__(
        self, load: LoadResult, entries: list[RuleEntry], failures: list[RuleLoadError]
    ) -> None:
        self.load = load
        self.entries = entries
        self.failures = failures  # with their Falco error codes
        self.errors = [str(f) for f in failures]
        self.active = [e for e in entries if e.status is RuleStatus.SUPPORTED]
        self._by_type: dict[str | None, tuple[RuleEntry, ...]] = {}

    @property
    def warnings(self) -> list[LoadWarning]:
        return self.load.warnings

    @classmethod
    def build(cls, load: LoadResult, registry: FieldRegistry, *, strict: bool = True) -> Ruleset:
        """Compile every rule. ``strict``: raise on the first problem, as Falco does."""
        return _Builder(load, registry, strict).build()

    def get(self, name: str) -> RuleEntry | None:
        return next((e for e in self.entries if e.name == name), None)

    def rules_for(self, evt_type: str | None) -> tuple[RuleEntry, ...]:
        """Active rules that can match this event type, in definition order."""
        found = self._by_type.get(evt_type)
        if found is None:
            found = tuple(e for e in self.active if evt_type in e.event_types)
            self._by_type[evt_type] = found
        return found

    def event_types(self) -> frozenset[str]:
        """Union of the event types the active rules need (see ``unbounded_rules``)."""
        names: set[str] = set()
        for e in self.active:
            if e.event_types.finite:
                names |= e.event_types.names
        return frozenset(names)

    def unbounded_rules(self) -> list[str]:
        """Active rules that may match (almost) any event type: the sensor cannot
        enumerate their syscalls, it must capture everything it can for them."""
        return [e.name for e in self.active if not e.event_types.finite]


class _Builder:
    def __init__(self, load: LoadResult, registry: FieldRegistry, strict: bool) -> None:
        self.load = load
        self.registry = registry
        self.strict = strict
        self.expander = Expander(load.lists, load.macros)
        self.failures: list[RuleLoadError] = []

    def build(self) -> Ruleset:
        expansions = self._check_macros()
        rules = sorted(self.load.rules.values(), key=lambda r: r.index)
        entries = [self._entry(r) for r in rules]
        expansions += [e.expansion for e in entries if e.expansion]
        self._warn_unused(expansions)
        return Ruleset(self.load, entries, self.failures)

    def _fail(self, err: RuleLoadError) -> None:
        if self.strict:
            raise err
        self.failures.append(err)

    def _check_macros(self) -> list[Expansion]:
        # Falco parses and resolves every macro, used or not.
        expansions = []
        for macro in sorted(self.load.macros.values(), key=lambda m: m.index):
            try:
                self._check_visibility(macro)
                expansions.append(self.expander.expand(macro.condition, macro.ctx))
            except RuleLoadError as e:
                self._fail(e)
        return expansions

    def _check_visibility(self, macro: MacroInfo) -> None:
        for name in macro_refs(self.expander.macro_ast(macro.name)):
            used = self.load.macros.get(name)
            if used is not None and used.index >= macro.visibility:
                raise RuleLoadError(
                    f"undefined macro '{name}' used in filter (it is defined after this macro)",
                    macro.ctx,
                )

    def _entry(self, rule: RuleInfo) -> RuleEntry:
        text = condition_with_exceptions(rule)
        entry = RuleEntry(rule, RuleStatus.SUPPORTED, text)
        if rule.source != SYSCALL_SOURCE:
            entry.status = RuleStatus.UNSUPPORTED
            entry.reason = f"unsupported source '{rule.source}'"
            return entry
        try:
            entry.expansion = self.expander.expand(text, rule.ctx)
        except RuleLoadError as e:
            self._fail(e)
            entry.status, entry.reason = RuleStatus.ERROR, e.reason
            return entry
        entry.event_types = event_types(entry.expansion.node)
        entry.missing_fields = missing_fields(entry.expansion.node, self.registry)
        # Falco compiles disabled rules too (they can be enabled at run time).
        self._compile(entry)
        if not rule.enabled and entry.status is RuleStatus.SUPPORTED:
            entry.status, entry.reason, entry.predicate = (
                RuleStatus.DISABLED,
                "enabled: false",
                None,
            )
        return entry

    def _compile(self, entry: RuleEntry) -> None:
        rule = entry.info
        assert entry.expansion is not None
        output = OutputTemplate(self._output_text(rule), self.registry)
        # Falco's order: exception fields (collector), output, then condition (compiler).
        for names, code in (
            (self._unknown_exception_fields(rule), VALIDATE),
            (sorted(set(output.unknown_fields)), COMPILE_OUTPUT),
            (entry.missing_fields, COMPILE_CONDITION),
        ):
            if names:
                self._unknown_fields(entry, names, code)
                return
        try:
            entry.predicate = compile_predicate(entry.expansion.node, self.registry, rule.ctx)
        except UnsupportedOperatorError as e:
            if self.strict:
                raise
            entry.status, entry.reason = RuleStatus.UNSUPPORTED, e.reason
            return
        except UnknownEventTypeError as e:
            if not rule.skip_if_unknown_filter:
                self._fail(e)
                entry.status, entry.reason = RuleStatus.ERROR, e.reason
                return
            self.load.warn(
                f"skipped (skip-if-unknown-filter): {e.reason}", rule.ctx, UNKNOWN_FILTER
            )
            entry.status, entry.reason = RuleStatus.UNSUPPORTED, e.reason
            return
        except RuleLoadError as e:
            self._fail(e)
            entry.status, entry.reason = RuleStatus.ERROR, e.reason
            return
        entry.output = output
        self._warn_compiled(entry)

    def _output_text(self, rule: RuleInfo) -> str:
        for name in _DEPRECATED_FIELDS:
            if name in rule.output:
                self.load.warn(f"usage of deprecated field '{name}' has been detected in the "
                               "rule output", rule.ctx, DEPRECATED_ITEM)  # fmt: skip
        if _CONTAINER_INFO not in rule.output:
            return rule.output
        self.load.warn(f"{_CONTAINER_INFO} is deprecated and expands to nothing", rule.ctx,
                       DEPRECATED_ITEM)  # fmt: skip
        return rule.output.replace(_CONTAINER_INFO, "")

    def _unknown_fields(self, entry: RuleEntry, names: list[str], code: str) -> None:
        """A field this sensor does not serve: Falco refuses the rule if it does
        not know the field either, unless it says skip-if-unknown-filter."""
        rule = entry.info
        text = ", ".join(names)
        entry.status, entry.reason = RuleStatus.UNSUPPORTED, f"unknown field {text}"
        if rule.skip_if_unknown_filter and code != VALIDATE:
            self.load.warn(f"skipped (skip-if-unknown-filter): unknown field {text}", rule.ctx,
                           UNKNOWN_FILTER)  # fmt: skip
        elif self.strict:
            raise unknown_field(self.registry, names[0], rule.ctx, code)

    def _unknown_exception_fields(self, rule: RuleInfo) -> list[str]:
        # Checked even when an exception has no values (and so adds no condition).
        texts = [f for ex in rule.exceptions for f in _exception_fields(ex)]
        refs, unparsable = [], []
        for text in texts:
            try:
                refs.append(field_ref(text))
            except ConditionParseError:
                unparsable.append(text)
        return sorted(set(unparsable) | set(unresolved_fields(refs, self.registry)))

    def _warn_compiled(self, entry: RuleEntry) -> None:
        rule = entry.info
        assert entry.expansion is not None
        for message in condition_warnings(entry.expansion.node, self.registry):
            self.load.warn(message, rule.ctx, COMPILE_CONDITION_WARNING)
        for name in sorted(set(fields_used(entry.expansion.node)) & set(_DEPRECATED_FIELDS)):
            self.load.warn(f"usage of deprecated field '{name}' in the condition", rule.ctx,
                           DEPRECATED_ITEM)  # fmt: skip
        if _compares_with_na(entry.expansion.node):
            self.load.warn("condition compares a field with <NA>: unsafe, the comparison "
                           "never sees a missing value", rule.ctx, UNSAFE_NA_CHECK)  # fmt: skip
        types = entry.event_types
        too_many = not types.finite or len(types.names) > _MAX_EVTTYPES
        if too_many and rule.warn_evttypes:
            self.load.warn("rule matches too many evt.type values (every event type but a few, "
                           "or no evt.type restriction): slow", rule.ctx, NO_EVTTYPE)  # fmt: skip

    def _warn_unused(self, expansions: list[Expansion]) -> None:
        """Falco counts a macro or list as used when any rule, macro or list names
        it (a macro only an unused macro names is still "used")."""
        used_macros: set[str] = set()
        used_lists = {i for lst in self.load.lists.values() for i in lst.items
                      if i in self.load.lists}  # fmt: skip
        for expansion in expansions:
            used_macros |= expansion.macros
            used_lists |= expansion.lists
        for name, macro in self.load.macros.items():
            if name not in used_macros:
                self.load.warn("macro not referred to by any other rule/macro", macro.ctx,
                               UNUSED_MACRO)  # fmt: skip
        for name, lst in self.load.lists.items():
            if name not in used_lists:
                self.load.warn("list not referred to by any other rule/macro", lst.ctx,
                               UNUSED_LIST)  # fmt: skip


# Falco no longer expands this output token (the container plugin adds its fields).
_CONTAINER_INFO = "%container.info"
# Fields Falco warns about (evt.dir: events are merged enter/exit pairs now).
_DEPRECATED_FIELDS = ("evt.dir",)
_NA_CHECK_OPS = ("=", "==", "!=", "in", "intersects", "pmatch")

# Falco warns about rules whose event-type set is empty or larger than this.
_MAX_EVTTYPES = 100


def _exception_fields(ex: ExceptionInfo) -> list[str]:
    fields = ex.fields if isinstance(ex.fields, list) else [ex.fields] if ex.fields else []
    return [f for f in fields if f]


def _compares_with_na(node: Node) -> bool:
    """Falco warns only for its JSON-event sources' fields (``ka.*``, ``jevt.*``)."""
    for check in iter_checks(node):
        if (
            isinstance(check, BinaryCheck)
            and check.field.name.startswith(("ka.", "jevt."))
            and check.op in _NA_CHECK_OPS
        ):
            rhs = check.value
            items = rhs.items if isinstance(rhs, ListValue) else (rhs,)
            if any(isinstance(v, Value) and v.text == "<NA>" for v in items):
                return True
    return False


class RuleEngine:
    """Evaluates a ruleset on events; the event object is opaque (extractors read it)."""

    def __init__(
        self, ruleset: Ruleset, registry: FieldRegistry, *, rule_matching: RuleMatching = "first"
    ) -> None:
        if rule_matching not in ("first", "all"):
            raise ValueError(f"rule_matching must be 'first' or 'all', not {rule_matching!r}")
        self.ruleset = ruleset
        self.registry = registry
        self.rule_matching = rule_matching
        self.eval_errors: dict[str, int] = {}
        self._extra = ExtraFields(registry)
        self._evt_type: Getter | None
        try:
            self._evt_type = make_getter(resolve_field(registry, FieldRef("evt.type"), None))
        except RuleLoadError:
            self._evt_type = None  # no index possible: every rule sees every event

    @classmethod
    def from_files(
        cls,
        paths: Sequence[Path | str],
        registry: FieldRegistry,
        *,
        strict: bool = True,
        rule_matching: RuleMatching = "first",
    ) -> RuleEngine:
        """Load rule files in order (later files override earlier ones) and compile them."""
        ruleset = Ruleset.build(load_files(paths), registry, strict=strict)
        return cls(ruleset, registry, rule_matching=rule_matching)

    @classmethod
    def from_texts(
        cls,
        sources: Iterable[tuple[str, str]],
        registry: FieldRegistry,
        *,
        strict: bool = True,
        rule_matching: RuleMatching = "first",
    ) -> RuleEngine:
        """Like ``from_files`` for (name, YAML text) pairs."""
        ruleset = Ruleset.build(load_texts(sources), registry, strict=strict)
        return cls(ruleset, registry, rule_matching=rule_matching)

    def event_types(self) -> frozenset[str]:
        return self.ruleset.event_types()

    def candidates(self, event: Any) -> tuple[RuleEntry, ...]:
        if self._evt_type is None:
            return tuple(self.ruleset.active)
        evt_type = self._evt_type(event)
        return self.ruleset.rules_for(evt_type if isinstance(evt_type, str) else None)

    def evaluate(self, event: Any) -> list[Match]:
        matches: list[Match] = []
        for entry in self.candidates(event):
            if self._matches(entry, event):
                matches.append(self._match(entry, event))
                if self.rule_matching == "first":
                    break
        return matches

    def _matches(self, entry: RuleEntry, event: Any) -> bool:
        assert entry.predicate is not None
        try:
            return entry.predicate(event)
        except Exception:
            # An extractor bug must not take the sensor down; count and log it once.
            count = self.eval_errors.get(entry.name, 0)
            self.eval_errors[entry.name] = count + 1
            if count == 0:
                log.exception("rule %r raised while evaluating an event", entry.name)
            return False

    def _match(self, entry: RuleEntry, event: Any) -> Match:
        assert entry.output is not None
        values = entry.output.values(event)
        fields = {k: json_value(v) for k, v in values.items()}
        for name, value in self._extra.values(event).items():
            fields.setdefault(name, json_value(value))
        info = entry.info
        return Match(
            rule=info.name,
            priority=info.priority,
            tags=tuple(sorted(info.tags)),
            output=entry.output.render(event, values),
            output_fields=fields,
            source=info.source,
        )
