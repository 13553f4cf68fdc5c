"""Which events can no loaded rule match? Decided from the event alone, cheaply.

The sensor completes a process from ``/proc`` after each exec (vpid,
capabilities, environment, overlay layer...) and evaluates every rule on
every event: on exec-heavy steps that work costs more CPU than the workload.
Almost none of those events can match: a ``/bin/true`` exec is no miner, a
read of ``libc.so.6`` is no credential.

``Prefilter`` partially evaluates each active rule's expanded condition with
only the fields that are final before that work is done (``LOCAL_FIELDS``:
the event's own type, arguments and fd, and the process's name, argv and
ancestry, all from the kernel records). Every other field is *unknown*, and
Kleene's three-valued logic propagates it: an event is dropped only when
every candidate rule is definitely false whatever the unknown fields hold,
so no match is ever lost. This is Falco's "interesting syscalls" idea one
step further: per event, not per syscall type.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from policies.falco.compiler import (
    Getter,
    compile_predicate,
    field_refs,
    iter_checks,
    make_getter,
    resolve_field,
)
from policies.falco.engine import RuleEngine, RuleEntry
from policies.falco.fieldapi import FieldRegistry
from policies.falco.grammar import (
    And,
    BinaryCheck,
    FieldRef,
    FieldValue,
    Node,
    Not,
    Or,
    UnaryCheck,
)
from policies.falco.loader import ItemContext
from policies.falco.output import ALWAYS_FIELDS

# Known before the post-exec /proc reads: the parser fills them from the records.
LOCAL_PREFIXES = ("evt.", "fd.")
LOCAL_FIELDS = frozenset({"proc.name", "proc.exe", "proc.args", "proc.cmdline", "proc.pname",
                          "proc.pexe", "proc.pcmdline", "proc.aname",
                          "container.id", "container.full_id"})  # fmt: skip
# Different in every event: as keys of the memo they would make every event new,
# so they count as unknown (which only lets more events through).
UNIQUE_PREFIXES = ("evt.num", "evt.time", "evt.datetime", "evt.rawtime", "evt.reltime",
                   "evt.latency", "evt.deltatime", "evt.cpu", "evt.count")  # fmt: skip
MEMO_SIZE = 8192

# None stands for "always possible": an unknown part needs no code at run time.
Maybe = Callable[[Any], bool] | None


def is_local(name: str) -> bool:
    if name.startswith(UNIQUE_PREFIXES):
        return False
    return name.startswith(LOCAL_PREFIXES) or name in LOCAL_FIELDS


def _local_refs(node: Node) -> set[FieldRef]:
    """The fields whose values decide every local check of the node."""
    refs: set[FieldRef] = set()
    for check in iter_checks(node):
        if _checks_local(check):
            refs.add(check.field)
            if isinstance(check, BinaryCheck) and isinstance(check.value, FieldValue):
                refs.add(check.value.field)
    return refs


@dataclass(frozen=True, slots=True)
class _Tri:
    """Can the node be true? Can it be false? (None: it can, whatever the event.)"""

    may_true: Maybe
    may_false: Maybe


_UNKNOWN = _Tri(None, None)


def _checks_local(check: UnaryCheck | BinaryCheck) -> bool:
    if isinstance(check, BinaryCheck) and isinstance(check.value, FieldValue):
        return is_local(check.field.name) and is_local(check.value.field.name)
    return is_local(check.field.name)


def _both(parts: list[Maybe], need_all: bool) -> Maybe:
    """All (``need_all``) or any of the parts may hold; None parts always may."""
    known = [p for p in parts if p is not None]
    if need_all:
        if not known:
            return None
        return lambda ev: all(p(ev) for p in known)
    if len(known) < len(parts):
        return None  # an unknown part can always hold
    return lambda ev: any(p(ev) for p in known)


def _rank(node: Node) -> int:
    """0 for a node on evt.type only, 1 with only evt./fd. fields, 2 otherwise."""
    names = {ref.name for ref in field_refs(node)}
    if names <= {"evt.type"}:
        return 0
    return 1 if all(n.startswith(LOCAL_PREFIXES) for n in names) else 2


def _tri(node: Node, registry: FieldRegistry, ctx: ItemContext | None) -> _Tri:
    if isinstance(node, (UnaryCheck, BinaryCheck)):
        if not _checks_local(node):
            return _UNKNOWN
        pred = compile_predicate(node, registry, ctx)
        return _Tri(pred, lambda ev: not pred(ev))
    if isinstance(node, Not):
        inner = _tri(node.child, registry, ctx)
        return _Tri(inner.may_false, inner.may_true)
    if isinstance(node, (And, Or)):
        # Most selective first: short-circuiting then rarely reaches proc checks.
        children = sorted(node.children, key=_rank)
        parts = [_tri(c, registry, ctx) for c in children]
        is_and = isinstance(node, And)
        # And: true needs every child true, false needs one false; Or the reverse.
        return _Tri(
            _both([p.may_true for p in parts], need_all=is_and),
            _both([p.may_false for p in parts], need_all=not is_and),
        )
    return _UNKNOWN  # a macro reference cannot survive expansion; stay safe


EXE_DETAIL_FIELDS = ("proc.exe_ino", "proc.is_exe_from_memfd")


def needs_exe_details(engine: RuleEngine) -> bool:
    """Do the active rules' conditions or outputs read the exe's inode or name?"""
    names = set(ALWAYS_FIELDS)
    for entry in engine.ruleset.active:
        names.update(entry.fields)
        if entry.output is not None:
            names.update(f.key for f in entry.output.fields)
    return any(name.startswith(EXE_DETAIL_FIELDS) for name in names)


class Prefilter:
    """``prefilter(evt)`` is False only if no active rule can match ``evt``.

    The verdict is a function of the local fields' values alone, so it is
    memoized on them: the events of a busy step repeat (the same exec, the
    same library opens), and extracting the values costs a fraction of
    evaluating the checks.
    """

    def __init__(self, engine: RuleEngine) -> None:
        self._engine = engine
        self._by_rule: dict[str, Maybe] = {}
        self._refs: dict[str, set[FieldRef]] = {}
        for entry in engine.ruleset.active:
            assert entry.expansion is not None
            node = entry.expansion.node
            self._by_rule[entry.name] = _tri(node, engine.registry, entry.info.ctx).may_true
            self._refs[entry.name] = _local_refs(node)
        self._getters: dict[str | None, list[Getter]] = {}
        self._memo: dict[tuple[Any, ...], bool] = {}
        self.passed = 0
        self.dropped = 0

    def __call__(self, evt: Any) -> bool:
        try:
            possible = self._verdict(evt)
        except Exception:  # an extractor bug: let the engine see it (and log it)
            possible = True
        if possible:
            self.passed += 1
        else:
            self.dropped += 1
        return possible

    def _verdict(self, evt: Any) -> bool:
        rules = self._engine.candidates(evt)
        if not rules:
            return False
        etype = evt.type
        getters = self._getters.get(etype)
        if getters is None:
            getters = self._getters[etype] = self._getters_for(rules)
        key = (etype, *(_hashable(get(evt)) for get in getters))
        verdict = self._memo.get(key)
        if verdict is None:
            verdict = any(self._may_match(entry.name, evt) for entry in rules)
            if len(self._memo) >= MEMO_SIZE:
                self._memo.clear()
            self._memo[key] = verdict
        return verdict

    def _getters_for(self, rules: tuple[RuleEntry, ...]) -> list[Getter]:
        refs = set().union(*(self._refs[entry.name] for entry in rules))
        ordered = sorted(refs, key=lambda ref: ref.text())
        registry = self._engine.registry
        return [make_getter(resolve_field(registry, ref, None)) for ref in ordered]

    def _may_match(self, rule: str, evt: Any) -> bool:
        may = self._by_rule[rule]
        return may is None or may(evt)


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def sensor_for(engine: RuleEngine, resolver: Any = None, backend: str | None = None) -> Any:
    """A sensor that traces the engine's event types and forwards only the events
    some loaded rule may match: the node sensor and `corral policy test` alike.
    ``backend`` None: ``$CORRAL_SENSOR_BACKEND``, else auto."""
    import os

    from policies.sensor.sensor import Sensor

    backend = backend or os.environ.get("CORRAL_SENSOR_BACKEND") or "auto"
    return Sensor(
        engine.event_types(),
        resolver=resolver,
        prefilter=Prefilter(engine),
        exe_details=needs_exe_details(engine),
        backend=backend,
    )
