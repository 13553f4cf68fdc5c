"""One comparison operator applied to one (normalised) value, as libsinsp does."""

from __future__ import annotations

import ipaddress
import operator
import re
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from policies.falco.calls import resolve_field
from policies.falco.fieldapi import FieldRegistry, FieldType
from policies.falco.grammar import BinaryCheck, FieldValue, ListValue
from policies.falco.loader import FieldTypeError, ItemContext, UnsupportedOperatorError
from policies.falco.resolve import IP_TYPES, NUMERIC, ResolvedField
from policies.falco.transformers import SEQ, Getter, ascii_lower, make_getter, to_int, to_text
from policies.falco.typecheck import convert

Predicate = Callable[[Any], bool]
_TEXT = (FieldType.STRING, FieldType.LIST, FieldType.BYTES)


def _glob_regex(pattern: str, flags: int = 0) -> re.Pattern[str]:
    """fnmatch(3) without flags: '*' also matches '/', backslash is literal."""
    out, i, n = [], 0, len(pattern)
    while i < n:
        c = pattern[i]
        i += 1
        if c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "[":
            j = i
            if j < n and pattern[j] in "!^":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 1
            if j >= n:
                out.append(re.escape(c))
                continue
            body = pattern[i:j]
            i = j + 1
            neg = body[:1] in ("!", "^")
            body = body[1:] if neg else body
            body = body.replace("\\", "\\\\").replace("^", "\\^")
            out.append(f"[{'^' if neg else ''}{body}]")
        else:
            out.append(re.escape(c))
    return re.compile("".join(out), re.DOTALL | flags)


def _components(path: str) -> tuple[str, ...]:
    return tuple(c for c in path.split("/") if c)


def _pmatch_test(paths: Sequence[str]) -> Callable[[Any], bool]:
    """libsinsp's path prefix search: a path matches a pattern whose components
    are a prefix of the path's, each component equal or (with ``*?[``) a glob."""
    literal: set[tuple[str, ...]] = set()
    globbed: list[tuple[Callable[[str], bool], ...]] = []
    root = False
    for p in paths:
        comps = _components(p)
        if not comps:
            root = root or p.startswith("/")
        elif any(ch in c for c in comps for ch in "*?["):
            globbed.append(tuple(_component_test(c) for c in comps))
        else:
            literal.add(comps)

    def test(x: Any) -> bool:
        path = to_text(x)
        if root and path.startswith("/"):
            return True
        comps = _components(path)
        for n in range(1, len(comps) + 1):
            if comps[:n] in literal:
                return True
        for pattern in globbed:
            head = comps[: len(pattern)]
            if len(head) == len(pattern) and all(t(c) for t, c in zip(pattern, head, strict=True)):
                return True
        return False

    return test


def _component_test(component: str) -> Callable[[str], bool]:
    if not any(ch in component for ch in "*?["):
        return partial(operator.eq, component)
    match = _glob_regex(component).fullmatch
    return lambda c: match(c) is not None


def _as_bytes(x: Any) -> bytes:
    if isinstance(x, (bytes, bytearray)):
        return bytes(x)
    return to_text(x).encode("utf-8", "surrogateescape")


def _hex(text: str, ctx: ItemContext | None) -> bytes:
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise FieldTypeError(f"'{text}' is not a hexadecimal byte string", ctx) from None


# Numeric comparisons, written as v OP x because partial binds the value first.
_NUM_CMP = {"<": operator.gt, "<=": operator.ge, ">": operator.lt, ">=": operator.le}


def _string_test(op: str, v: str, ctx: ItemContext | None) -> Callable[[Any], bool]:
    if op in ("=", "=="):
        return partial(operator.eq, v)
    if op == "!=":
        return partial(operator.ne, v)
    if op == "contains":
        return lambda x: v in x
    if op == "icontains":
        low = ascii_lower(v)
        return lambda x: low in ascii_lower(x)
    if op == "startswith":
        return lambda x: x.startswith(v)
    if op == "endswith":
        return lambda x: x.endswith(v)
    if op in ("glob", "iglob"):
        flags = re.IGNORECASE | re.ASCII if op == "iglob" else 0  # ASCII letters, as libsinsp
        match = _glob_regex(v, flags).fullmatch
        return lambda x: match(x) is not None
    if op == "regex":
        try:
            rmatch = re.compile(v).fullmatch
        except re.error as e:
            raise FieldTypeError(f"invalid regex '{v}': {e}", ctx) from None
        return lambda x: rmatch(x) is not None
    if op in ("bcontains", "bstartswith"):
        needle = _hex(v, ctx)
        if op == "bcontains":
            return lambda x: needle in _as_bytes(x)
        return lambda x: _as_bytes(x).startswith(needle)
    raise UnsupportedOperatorError(f"unsupported operator '{op}'", ctx)


def _ip_eq(v: Any) -> Callable[[Any], bool]:
    if isinstance(v, (ipaddress.IPv4Network, ipaddress.IPv6Network)):
        return lambda x: x.version == v.version and x in v
    return partial(operator.eq, v)


def scalar_test(
    op: str, rhs: Any, fld: ResolvedField, ctx: ItemContext | None
) -> Callable[[Any], bool]:
    """A test for one non-None (normalised) value of the field."""
    ftype = fld.type
    name = fld.ref.name
    values = [v.text for v in rhs.items] if isinstance(rhs, ListValue) else [rhs.text]
    if op == "pmatch":
        return _pmatch_test(values)
    if op in ("in", "intersects"):
        if ftype in IP_TYPES:
            tests = [_ip_eq(convert(t, ftype, ctx, name)) for t in values]
            return lambda x: any(t(x) for t in tests)
        members = frozenset(convert(t, ftype, ctx, name) for t in values)
        return members.__contains__
    text = values[0]
    if op in _NUM_CMP:
        cmp = partial(_NUM_CMP[op], convert(text, FieldType.INT, ctx, name))
        if ftype in NUMERIC:
            return cmp
        return lambda x: (n := to_int(x)) is not None and cmp(n)
    if op in ("=", "==", "!=") and ftype not in _TEXT:
        v = convert(text, ftype, ctx, name)
        test = _ip_eq(v) if ftype in IP_TYPES else partial(operator.eq, v)
        return test if op != "!=" else lambda x: not test(x)
    # typecheck.check_operator left only string fields for the other operators
    return _string_test(op, text, ctx)


def modified_test(
    op: str, modifier: str, rhs: ListValue, fld: ResolvedField, ctx: ItemContext | None
) -> Callable[[Any], bool]:
    """Falco 0.44's ``op oneof|anyof|allof (items)``: ``op`` against each item,
    then exactly one / at least one / all of them; an empty list never matches."""
    tests = [scalar_test(op, item, fld, ctx) for item in rhs.items]
    if not tests:
        return lambda x: False
    if modifier == "anyof":
        return lambda x: any(t(x) for t in tests)
    if modifier == "allof":
        return lambda x: all(t(x) for t in tests)
    return lambda x: sum(1 for t in tests if t(x)) == 1


def lift(get: Getter, test: Callable[[Any], bool]) -> Predicate:
    """None -> false; a list value -> true if any element passes (proc.aname semantics)."""

    def pred(ev: Any) -> bool:
        v = get(ev)
        if v is None:
            return False
        if v.__class__ in SEQ:
            # explicit loops here and below: measurably faster than any()/all() on hot paths
            for x in v:  # noqa: SIM110
                if x is not None and test(x):
                    return True
            return False
        return test(v)

    return pred


_FIELD_CMP: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq,
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "contains": lambda a, b: to_text(b) in to_text(a),
    "icontains": lambda a, b: ascii_lower(to_text(b)) in ascii_lower(to_text(a)),
    "startswith": lambda a, b: to_text(a).startswith(to_text(b)),
    "endswith": lambda a, b: to_text(a).endswith(to_text(b)),
}


# libsinsp fields with their own comparison logic: no field on the right of them,
# and not usable on the right (besides fd.ip/fd.net/fd.port-like ones over both ends).
_CUSTOM_COMPARE = frozenset({
    "evt.rawarg", "evt.around", "proc.apid", "proc.aname", "proc.aexe", "proc.aexepath",
    "proc.acmdline", "proc.aenv", "fd.cip.name", "fd.sip.name", "fd.lip.name", "fd.rip.name",
})  # fmt: skip


def _custom_compare(fld: ResolvedField) -> bool:
    return fld.spec.both_ends or fld.spec.name in _CUSTOM_COMPARE


def _family(ftype: FieldType) -> str:
    if ftype in _TEXT:
        return "text"
    if ftype in NUMERIC:
        return "number"
    return ftype.value


def field_to_field(
    check: BinaryCheck, left: Getter, registry: FieldRegistry, ctx: ItemContext | None
) -> Predicate:
    assert isinstance(check.value, FieldValue)
    cmp = _FIELD_CMP.get(check.op)
    if cmp is None:
        raise UnsupportedOperatorError(
            f"operator '{check.op}' is not supported with a field on the right", ctx
        )
    if check.value.val_arg is not None:
        raise FieldTypeError("transformer 'val' does not support field arguments", ctx)
    lhs = resolve_field(registry, check.field, ctx)
    rhs = resolve_field(registry, check.value.field, ctx)
    if lhs.type is FieldType.IPNET:
        raise FieldTypeError("field type 'IPNET' doesn't support right-hand side fields", ctx)
    if _custom_compare(lhs):
        raise FieldTypeError(f"field '{lhs.spec.name}' doesn't support right-hand side fields", ctx)
    if _custom_compare(rhs):
        raise FieldTypeError(f"field '{rhs.spec.name}' can't be used as a right-hand side field",
                             ctx)  # fmt: skip
    if _family(lhs.type) != _family(rhs.type):
        raise FieldTypeError(
            f"cannot compare {lhs.type.value} field '{check.field.text()}' with "
            f"{rhs.type.value} field '{check.value.field.text()}'",
            ctx,
        )
    right = make_getter(rhs)

    def pred(ev: Any) -> bool:
        a = left(ev)
        if a is None:
            return False
        b = right(ev)
        if b is None:
            return False
        try:
            return bool(cmp(a, b))
        except TypeError:
            return False

    return pred
