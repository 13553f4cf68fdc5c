"""Event-type sets: which ``evt.type`` values a condition can be true for."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

from policies.falco.grammar import And, BinaryCheck, ListValue, Node, Not, Or, Value
from policies.falco.loader import ItemContext, UnknownEventTypeError

_NAMES_FILE = Path(__file__).with_name("event_names.txt")


@cache
def known_event_types() -> frozenset[str]:
    """Every name ``evt.type`` can take (syscalls and libsinsp's own events)."""
    lines = _NAMES_FILE.read_text(encoding="utf-8").splitlines()
    return frozenset(n.strip() for n in lines if n.strip() and not n.startswith("#"))


def check_event_type_values(check: BinaryCheck, ctx: ItemContext | None) -> None:
    """libsinsp refuses an ``evt.type`` comparison with a name it does not know."""
    names = _evt_type_values(check)
    unknown = sorted((names or frozenset()) - known_event_types())
    if unknown:
        raise UnknownEventTypeError(f"unknown event type {', '.join(unknown)}", ctx)


# --- event types ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EventTypes:
    """A set of event type names, or (``complement``) every type except ``names``."""

    names: frozenset[str] = frozenset()
    complement: bool = False

    @classmethod
    def all(cls) -> EventTypes:
        return cls(frozenset(), True)

    @property
    def is_all(self) -> bool:
        return self.complement and not self.names

    @property
    def finite(self) -> bool:
        return not self.complement

    def __contains__(self, name: object) -> bool:
        return (name in self.names) != self.complement

    def invert(self) -> EventTypes:
        return EventTypes(self.names, not self.complement)

    def __and__(self, other: EventTypes) -> EventTypes:
        a, b = self, other
        if a.finite and b.finite:
            return EventTypes(a.names & b.names)
        if a.finite:
            return EventTypes(a.names - b.names)
        if b.finite:
            return EventTypes(b.names - a.names)
        return EventTypes(a.names | b.names, True)

    def __or__(self, other: EventTypes) -> EventTypes:
        return (self.invert() & other.invert()).invert()

    def describe(self) -> str:
        if self.is_all:
            return "all event types"
        names = ", ".join(sorted(self.names))
        return f"all event types except ({names})" if self.complement else f"({names})"


def _evt_type_values(check: BinaryCheck) -> frozenset[str] | None:
    if check.field.name != "evt.type" or check.field.arg or check.field.transformers:
        return None
    if check.op not in ("=", "==", "!=", "in"):
        return None
    if check.op == "!=" and check.modifier not in (None, "allof"):
        return None  # true for every type once two names differ: no restriction
    rhs = check.value
    if isinstance(rhs, Value):
        return frozenset((rhs.text,))
    if isinstance(rhs, ListValue):
        return frozenset(v.text for v in rhs.items)
    return None


def _truth_sets(node: Node) -> tuple[EventTypes, EventTypes]:
    """(types where the node can be true, types where it can be false)."""
    everything = EventTypes.all()
    if isinstance(node, BinaryCheck):
        names = _evt_type_values(node)
        if names is None:
            return everything, everything
        exact = EventTypes(names)
        return (exact.invert(), exact) if node.op == "!=" else (exact, exact.invert())
    if isinstance(node, Not):
        pos, neg = _truth_sets(node.child)
        return neg, pos
    if isinstance(node, (And, Or)):
        sets = [_truth_sets(c) for c in node.children]
        pos, neg = sets[0]
        for p, n in sets[1:]:
            pos, neg = (pos & p, neg | n) if isinstance(node, And) else (pos | p, neg & n)
        return pos, neg
    return everything, everything


def event_types(node: Node) -> EventTypes:
    """The event types for which the condition can be true (a sound over-approximation)."""
    return _truth_sets(node)[0]
