"""Compile expanded conditions to closures.

Pipeline for one rule, as Falco does it (one module per step):

1. ``expand.condition_with_exceptions``: the rule's exceptions become
   ``(<condition>) and not (...)`` text, built the way Falco builds it.
2. ``expand.Expander.expand``: parse, inline macros and lists.
3. ``typecheck``: every field resolved in the registry, every operator and
   value checked against the field's type (libsinsp's verdicts).
4. ``compile_predicate``: every check becomes a closure over a registry
   extractor (``transformers``) and an operator test (``operators``); a
   missing value (None) makes any comparison false, so ``not <check>`` on a
   missing field is true, exactly like libsinsp.
5. ``evttypes.event_types``: the set of ``evt.type`` values for which the
   condition can be true, used to index rules by event type.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from policies.falco.calls import resolve_field
from policies.falco.evttypes import EventTypes, check_event_type_values, event_types
from policies.falco.expand import (
    Expander,
    Expansion,
    condition_with_exceptions,
    field_refs,
    fields_used,
    iter_checks,
    macro_refs,
)
from policies.falco.fieldapi import FieldRegistry, FieldType
from policies.falco.grammar import (
    And,
    BinaryCheck,
    FieldRef,
    FieldValue,
    ListValue,
    Node,
    Not,
    Or,
    UnaryCheck,
    Value,
)
from policies.falco.loader import FieldTypeError, ItemContext, RuleLoadError, UnknownFieldError
from policies.falco.operators import Predicate, field_to_field, lift, modified_test, scalar_test
from policies.falco.resolve import ResolvedField
from policies.falco.transformers import Getter, make_getter, to_text
from policies.falco.typecheck import check_operator

__all__ = [
    "EventTypes",
    "Expander",
    "Expansion",
    "Getter",
    "Predicate",
    "ResolvedField",
    "compile_predicate",
    "condition_with_exceptions",
    "event_types",
    "field_refs",
    "fields_used",
    "iter_checks",
    "macro_refs",
    "make_getter",
    "missing_fields",
    "resolve_field",
    "to_text",
    "unresolved_fields",
]


def _compile_check(
    check: UnaryCheck | BinaryCheck, registry: FieldRegistry, ctx: ItemContext | None
) -> Predicate:
    fld = resolve_field(registry, check.field, ctx)
    check_operator(fld, check.op, ctx)
    if isinstance(check, BinaryCheck):
        check_event_type_values(check, ctx)
    if isinstance(check, BinaryCheck):
        _refuse_nul(check, fld, ctx)
    get = make_getter(fld)
    if isinstance(check, UnaryCheck):
        return lambda ev: (v := get(ev)) is not None and v != []
    if isinstance(check.value, FieldValue):
        return field_to_field(check, get, registry, ctx)
    if check.op == "!=" and fld.spec.both_ends:
        equal = lift(get, scalar_test("=", check.value, fld, ctx))
        return lambda ev: get(ev) is not None and not equal(ev)
    if check.modifier:
        items = check.value if isinstance(check.value, ListValue) else ListValue((check.value,))
        return lift(get, modified_test(check.op, check.modifier, items, fld, ctx))
    return lift(get, scalar_test(check.op, check.value, fld, ctx))


def _refuse_nul(check: BinaryCheck, fld: ResolvedField, ctx: ItemContext | None) -> None:
    """libsinsp refuses a NUL byte in a value unless the field is a byte buffer."""
    rhs = check.value
    values = rhs.items if isinstance(rhs, ListValue) else [rhs] if isinstance(rhs, Value) else []
    if fld.type is not FieldType.BYTES and any("\x00" in v.text for v in values):
        raise FieldTypeError(f"a NUL byte in a value of field '{fld.ref.text()}'", ctx)


def _all(preds: tuple[Predicate, ...]) -> Predicate:
    if len(preds) == 2:
        a, b = preds
        return lambda ev: a(ev) and b(ev)

    def pred(ev: Any) -> bool:
        for p in preds:  # noqa: SIM110
            if not p(ev):
                return False
        return True

    return pred


def _any(preds: tuple[Predicate, ...]) -> Predicate:
    if len(preds) == 2:
        a, b = preds
        return lambda ev: a(ev) or b(ev)

    def pred(ev: Any) -> bool:
        for p in preds:  # noqa: SIM110
            if p(ev):
                return True
        return False

    return pred


def compile_predicate(node: Node, registry: FieldRegistry, ctx: ItemContext | None) -> Predicate:
    """Compile an expanded AST (no macro references) into ``event -> bool``."""
    if isinstance(node, (UnaryCheck, BinaryCheck)):
        return _compile_check(node, registry, ctx)
    if isinstance(node, Not):
        inner = compile_predicate(node.child, registry, ctx)
        return lambda ev: not inner(ev)
    if isinstance(node, And):
        return _all(tuple(compile_predicate(c, registry, ctx) for c in node.children))
    if isinstance(node, Or):
        return _any(tuple(compile_predicate(c, registry, ctx) for c in node.children))
    raise RuleLoadError(f"undefined macro '{node.name}' used in condition", ctx)


def missing_fields(node: Node, registry: FieldRegistry) -> list[str]:
    """Fields of the condition the registry cannot resolve (all of them, not just the first)."""
    return unresolved_fields(field_refs(node), registry)


def unresolved_fields(refs: Iterable[FieldRef], registry: FieldRegistry) -> list[str]:
    """The names among ``refs`` the registry does not know."""
    missing: set[str] = set()
    for ref in refs:
        try:
            resolve_field(registry, ref, None)
        except UnknownFieldError:
            missing.add(ref.name)
        except RuleLoadError:
            pass
    return sorted(missing)
