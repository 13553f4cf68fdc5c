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

from policies.falco.compiler import compile_predicate, field_refs
from policies.falco.engine import RuleEngine
from policies.falco.fieldapi import FieldRegistry
from policies.falco.grammar import And, BinaryCheck, FieldValue, Node, Not, Or, UnaryCheck
from policies.falco.loader import ItemContext

# Known before the post-exec /proc reads: the parser fills them from the records.
LOCAL_PREFIXES = ("evt.", "fd.")
LOCAL_FIELDS = frozenset({"proc.name", "proc.exe", "proc.args", "proc.cmdline", "proc.pname",
                          "proc.pexe", "proc.pcmdline", "proc.aname", "proc.pid", "proc.ppid",
                          "container.id", "container.full_id"})  # fmt: skip

# None stands for "always possible": an unknown part needs no code at run time.
Maybe = Callable[[Any], bool] | None


def is_local(name: str) -> bool:
    return name.startswith(LOCAL_PREFIXES) or name in LOCAL_FIELDS


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


class Prefilter:
    """``prefilter(evt)`` is False only if no active rule can match ``evt``."""

    def __init__(self, engine: RuleEngine) -> None:
        self._engine = engine
        self._by_rule: dict[str, Maybe] = {}
        for entry in engine.ruleset.active:
            assert entry.expansion is not None
            tri = _tri(entry.expansion.node, engine.registry, entry.info.ctx)
            self._by_rule[entry.name] = tri.may_true
        self.passed = 0
        self.dropped = 0

    def __call__(self, evt: Any) -> bool:
        try:
            rules = self._engine.candidates(evt)
            possible = any(self._may_match(entry.name, evt) for entry in rules)
        except Exception:  # an extractor bug: let the engine see it (and log it)
            possible = True
        if possible:
            self.passed += 1
        else:
            self.dropped += 1
        return possible

    def _may_match(self, rule: str, evt: Any) -> bool:
        may = self._by_rule[rule]
        return may is None or may(evt)
