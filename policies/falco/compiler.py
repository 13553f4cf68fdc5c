"""Expand conditions (exceptions, macros, lists) and compile them to closures.

Pipeline for one rule, as Falco does it:

1. ``condition_with_exceptions``: the rule's exceptions become
   ``(<condition>) and not (...)`` text, built the way Falco builds it.
2. ``Expander.expand``: parse, inline macros (recursively) and lists inside
   value lists (recursively, list items that are quoted strings unquoted).
3. ``compile_predicate``: every check becomes a closure over a registry
   extractor; a missing value (None) makes any comparison false, so
   ``not <check>`` on a missing field is true, exactly like libsinsp.
4. ``event_types``: the set of ``evt.type`` values for which the condition
   can be true, used to index rules by event type.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import operator
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from policies.falco.fieldapi import ArgKind, FieldRegistry, FieldSpec, FieldType
from policies.falco.grammar import (
    LIST_OPS,
    And,
    BinaryCheck,
    ConditionParseError,
    FieldRef,
    FieldValue,
    ListValue,
    MacroRef,
    Node,
    Not,
    Or,
    UnaryCheck,
    Value,
    is_quoted,
    parse_condition,
    quote_value,
    unquote,
)
from policies.falco.loader import (
    ConditionSyntaxError,
    ExceptionInfo,
    ItemContext,
    ListInfo,
    MacroInfo,
    RuleInfo,
    RuleLoadError,
    UnknownFieldError,
    UnsupportedOperatorError,
)

Predicate = Callable[[Any], bool]
Getter = Callable[[Any], Any]

_SEQ = (list, tuple)
_NUMERIC = (FieldType.INT, FieldType.PORT, FieldType.RELTIME, FieldType.ABSTIME)
_IP = (FieldType.IPADDR, FieldType.IPNET)


# --- exceptions -> condition text ----------------------------------------------


def _quote_item(text: str) -> str:
    # Falco quotes items with blanks unless they are already quoted; we also
    # quote other characters a bare value cannot hold, and escape what we quote.
    if is_quoted(text):
        return text
    return quote_value(text)


def _paren_item(text: str) -> str:
    return text if text.startswith("(") else f"({text})"


def _exception_text(ex: ExceptionInfo) -> str:
    if not isinstance(ex.fields, list):
        if not ex.values:
            return ""
        items = ", ".join(_quote_item(str(v)) for v in ex.values)
        return f"({ex.fields} {ex.comps} ({items}))"
    comps = ex.comps if isinstance(ex.comps, list) else ["="] * len(ex.fields)
    alternatives = []
    for values in ex.values:
        terms = []
        for fld, comp, val in zip(ex.fields, comps, values, strict=True):
            if isinstance(val, list):
                rhs = "(" + ", ".join(_quote_item(str(v)) for v in val) + ")"
            elif comp in LIST_OPS:
                rhs = _paren_item(str(val))
            else:
                rhs = _quote_item(str(val))
            terms.append(f"{fld} {comp} {rhs}")
        alternatives.append("(" + " and ".join(terms) + ")")
    return "(" + " or ".join(alternatives) + ")" if alternatives else ""


def condition_with_exceptions(rule: RuleInfo) -> str:
    """The rule's condition with its exceptions appended as Falco expands them."""
    if not rule.exceptions:
        return rule.condition
    text = f"({rule.condition})"
    for ex in rule.exceptions:
        icond = _exception_text(ex)
        if icond:
            text += f" and not {icond}"
    return text


# --- macro and list expansion ------------------------------------------------------


@dataclass
class Expansion:
    node: Node
    macros: set[str] = field(default_factory=set)
    lists: set[str] = field(default_factory=set)


class Expander:
    """Inlines macros and lists; parsed macro bodies are cached."""

    def __init__(self, lists: Mapping[str, ListInfo], macros: Mapping[str, MacroInfo]) -> None:
        self._lists = lists
        self._macros = macros
        self._parsed: dict[str, Node] = {}
        self._list_values: dict[str, tuple[Value, ...]] = {}

    def parse(self, text: str, ctx: ItemContext) -> Node:
        try:
            return parse_condition(text)
        except ConditionParseError as e:
            raise ConditionSyntaxError(f"invalid condition: {e}", ctx) from None

    def macro_ast(self, name: str) -> Node:
        if name not in self._parsed:
            info = self._macros[name]
            self._parsed[name] = self.parse(info.condition, info.ctx)
        return self._parsed[name]

    def expand(self, text: str, ctx: ItemContext) -> Expansion:
        out = Expansion(self.parse(text, ctx))
        out.node = self._node(out.node, out, ctx, ())
        return out

    def _node(self, node: Node, out: Expansion, ctx: ItemContext, stack: tuple[str, ...]) -> Node:
        if isinstance(node, MacroRef):
            return self._macro(node.name, out, ctx, stack)
        if isinstance(node, Not):
            return Not(self._node(node.child, out, ctx, stack))
        if isinstance(node, (And, Or)):
            children = tuple(self._node(c, out, ctx, stack) for c in node.children)
            return type(node)(children)
        if isinstance(node, BinaryCheck) and node.op in LIST_OPS:
            return BinaryCheck(node.field, node.op, self._rhs(node.value, out, ctx))
        return node

    def _macro(self, name: str, out: Expansion, ctx: ItemContext, stack: tuple[str, ...]) -> Node:
        if name not in self._macros:
            raise RuleLoadError(f"undefined macro '{name}' used in condition", ctx)
        if name in stack:
            chain = " -> ".join((*stack, name))
            raise RuleLoadError(f"macro '{name}' references itself ({chain})", ctx)
        out.macros.add(name)
        return self._node(self.macro_ast(name), out, ctx, (*stack, name))

    def _rhs(self, rhs: Any, out: Expansion, ctx: ItemContext) -> Any:
        if isinstance(rhs, Value):
            # ``x in some_list`` without parentheses: a list name, else one value.
            if not rhs.quoted and rhs.text in self._lists:
                return ListValue(self._list_items(rhs.text, out, ctx, ()))
            return ListValue((rhs,))
        if isinstance(rhs, ListValue):
            items: list[Value] = []
            for v in rhs.items:
                if not v.quoted and v.text in self._lists:
                    items.extend(self._list_items(v.text, out, ctx, ()))
                else:
                    items.append(v)
            return ListValue(tuple(items))
        return rhs

    def _list_items(
        self, name: str, out: Expansion, ctx: ItemContext, stack: tuple[str, ...]
    ) -> tuple[Value, ...]:
        out.lists.add(name)
        if name in self._list_values:
            out.lists.update(self._nested_lists(name, ()))
            return self._list_values[name]
        if name in stack:
            raise RuleLoadError(f"list '{name}' references itself", ctx)
        values: list[Value] = []
        for item in self._lists[name].items:
            if item in self._lists:
                values.extend(self._list_items(item, out, ctx, (*stack, name)))
            else:
                values.append(_item_value(item, self._lists[name].ctx))
        self._list_values[name] = tuple(values)
        return self._list_values[name]

    def _nested_lists(self, name: str, stack: tuple[str, ...]) -> set[str]:
        found: set[str] = set()
        for item in self._lists[name].items:
            if item in self._lists and item not in stack:
                found.add(item)
                found |= self._nested_lists(item, (*stack, name))
        return found


def _item_value(item: str, ctx: ItemContext) -> Value:
    # List items were pasted into condition text by Falco, so '"(systemd)"' is
    # the quoted string (systemd), not a value with quote characters in it.
    if is_quoted(item):
        try:
            return Value(unquote(item), quoted=True)
        except ConditionParseError as e:
            raise RuleLoadError(f"invalid list item {item}: {e}", ctx) from None
    return Value(item)


# --- walking the AST ---------------------------------------------------------------


def iter_checks(node: Node) -> Iterable[UnaryCheck | BinaryCheck]:
    if isinstance(node, (UnaryCheck, BinaryCheck)):
        yield node
    elif isinstance(node, Not):
        yield from iter_checks(node.child)
    elif isinstance(node, (And, Or)):
        for c in node.children:
            yield from iter_checks(c)


def field_refs(node: Node) -> list[FieldRef]:
    """Every field reference in the (expanded) condition, in order, with duplicates."""
    refs: list[FieldRef] = []
    for check in iter_checks(node):
        refs.append(check.field)
        if isinstance(check, BinaryCheck) and isinstance(check.value, FieldValue):
            refs.append(check.value.field)
    return refs


def fields_used(node: Node) -> list[str]:
    """Field names used by the condition, sorted, without arguments."""
    return sorted({r.name for r in field_refs(node)})


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


# --- fields -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ResolvedField:
    spec: FieldSpec
    arg: str | int | None
    ref: FieldRef

    @property
    def type(self) -> FieldType:
        """The value type after transformers."""
        if not self.ref.transformers:
            return self.spec.type
        return FieldType.INT if self.ref.transformers[0] == "len" else FieldType.STRING


def _parse_arg(arg: str | None) -> str | int | None:
    if arg is not None and re.fullmatch(r"-?[0-9]+", arg):
        return int(arg)
    return arg


def resolve_field(registry: FieldRegistry, ref: FieldRef, ctx: ItemContext | None) -> ResolvedField:
    """Look a field up, with Falco's ``evt.arg.X`` == ``evt.arg[X]`` prefix rule."""
    spec = registry.get(ref.name)
    arg: str | None = ref.arg
    if spec is None and arg is None:
        parts = ref.name.split(".")
        for cut in range(len(parts) - 1, 1, -1):
            base = registry.get(".".join(parts[:cut]))
            if base is not None and base.arg is not ArgKind.NONE:
                spec, arg = base, ".".join(parts[cut:])
                break
    if spec is None:
        raise UnknownFieldError(ref.name, ctx, "not in the field registry")
    if spec.arg is ArgKind.NONE and arg is not None:
        raise UnsupportedOperatorError(f"field '{ref.name}' does not take an argument", ctx)
    if spec.arg is ArgKind.REQUIRED and arg is None:
        raise UnsupportedOperatorError(f"field '{ref.name}' requires an argument", ctx)
    return ResolvedField(spec, _parse_arg(arg), ref)


def to_text(value: Any) -> str:
    """A scalar as Falco prints it."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def _to_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return int(value)
    try:
        return int(value)
    except (TypeError, ValueError):
        try:
            return parse_number(str(value))
        except ValueError:
            return None


def _to_bool(value: Any) -> bool | None:
    if isinstance(value, str):
        low = value.lower()
        return True if low == "true" else False if low == "false" else None
    return bool(value)


def _to_ip(value: Any) -> Any:
    try:
        return ipaddress.ip_address(value if isinstance(value, int) else str(value))
    except ValueError:
        return None


def _norm_text(value: Any) -> str:
    # Bytes (buffers) decode losslessly so that bcontains sees the original bytes.
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "surrogateescape")
    return to_text(value)


_NORMALIZE: dict[FieldType, Callable[[Any], Any]] = {
    FieldType.STRING: _norm_text,
    FieldType.LIST: _norm_text,
    FieldType.INT: _to_int,
    FieldType.PORT: _to_int,
    FieldType.RELTIME: _to_int,
    FieldType.ABSTIME: _to_int,
    FieldType.BOOL: _to_bool,
    FieldType.IPADDR: _to_ip,
    FieldType.IPNET: _to_ip,
}
_PYTYPE: dict[FieldType, type] = {
    FieldType.STRING: str, FieldType.LIST: str, FieldType.INT: int, FieldType.PORT: int,
    FieldType.RELTIME: int, FieldType.ABSTIME: int, FieldType.BOOL: bool,
}


def _transform(name: str, value: Any) -> Any:
    if name == "len":
        return len(value) if isinstance(value, (str, bytes, list, tuple)) else None
    if isinstance(value, _SEQ):
        return [_transform(name, v) for v in value]
    text = to_text(value)
    if name == "tolower":
        return text.lower()
    if name == "toupper":
        return text.upper()
    if name == "basename":
        return text.rsplit("/", 1)[-1]
    try:  # b64
        return base64.b64decode(text, validate=True).decode("utf-8", "replace")
    except (binascii.Error, ValueError):
        return None


def make_getter(field_: ResolvedField) -> Getter:
    """A function event -> normalised value (None, a scalar, or a list of scalars)."""
    ext, arg = field_.spec.extractor, field_.arg
    ftype = field_.spec.type
    norm = _NORMALIZE.get(ftype, lambda v: v)
    pytype = _PYTYPE.get(ftype)

    def get(ev: Any) -> Any:
        v = ext(ev, arg)
        if v is None or v.__class__ is pytype:
            return v
        if v.__class__ in _SEQ:
            return [norm(x) for x in v]
        return norm(v)

    if not field_.ref.transformers:
        return get
    chain = tuple(reversed(field_.ref.transformers))

    def get_transformed(ev: Any) -> Any:
        v = get(ev)
        for t in chain:
            if v is None:
                return None
            v = _transform(t, v)
        return v

    return get_transformed


# --- values -----------------------------------------------------------------------


def parse_number(text: str) -> int:
    text = text.strip()
    if re.fullmatch(r"[+\-]?0[xX][0-9a-fA-F]+", text):
        return int(text, 16)
    try:
        return int(text, 10)
    except ValueError:
        number = float(text)  # raises ValueError on garbage
        if not number.is_integer():
            raise ValueError(text) from None
        return int(number)


def _convert(text: str, ftype: FieldType, ctx: ItemContext | None, name: str) -> Any:
    try:
        if ftype in _NUMERIC:
            return parse_number(text)
        if ftype is FieldType.BOOL:
            low = text.lower()
            if low in ("true", "1"):
                return True
            if low in ("false", "0"):
                return False
            raise ValueError(text)
        if ftype in _IP:
            if "/" in text or ftype is FieldType.IPNET:
                return ipaddress.ip_network(text, strict=False)
            return ipaddress.ip_address(text)
    except ValueError:
        raise RuleLoadError(
            f"value '{text}' is not a valid {ftype.value} for field '{name}'", ctx
        ) from None
    return text


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


def _pmatch_test(paths: Sequence[str]) -> Callable[[Any], bool]:
    prefixes = frozenset(p.rstrip("/") or "/" for p in paths)

    def test(x: Any) -> bool:
        path = to_text(x)
        if path in prefixes or ("/" in prefixes and path.startswith("/")):
            return True
        cut = path.rfind("/")
        while cut > 0:
            path = path[:cut]
            if path in prefixes:
                return True
            cut = path.rfind("/")
        return False

    return test


def _as_bytes(x: Any) -> bytes:
    if isinstance(x, (bytes, bytearray)):
        return bytes(x)
    return to_text(x).encode("utf-8", "surrogateescape")


def _hex(text: str, ctx: ItemContext | None) -> bytes:
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise RuleLoadError(f"'{text}' is not a hexadecimal byte string", ctx) from None


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
        low = v.lower()
        return lambda x: low in x.lower()
    if op == "startswith":
        return lambda x: x.startswith(v)
    if op == "endswith":
        return lambda x: x.endswith(v)
    if op in ("glob", "iglob"):
        match = _glob_regex(v, re.IGNORECASE if op == "iglob" else 0).fullmatch
        return lambda x: match(x) is not None
    if op == "regex":
        try:
            rmatch = re.compile(v).fullmatch
        except re.error as e:
            raise RuleLoadError(f"invalid regex '{v}': {e}", ctx) from None
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


def _scalar_test(
    op: str, rhs: Any, fld: ResolvedField, ctx: ItemContext | None
) -> Callable[[Any], bool]:
    """A test for one non-None (normalised) value of the field."""
    ftype = fld.type
    name = fld.ref.name
    values = [v.text for v in rhs.items] if isinstance(rhs, ListValue) else [rhs.text]
    if op == "pmatch":
        return _pmatch_test(values)
    if op in ("in", "intersects"):
        if ftype in _IP:
            tests = [_ip_eq(_convert(t, ftype, ctx, name)) for t in values]
            return lambda x: any(t(x) for t in tests)
        members = frozenset(_convert(t, ftype, ctx, name) for t in values)
        return members.__contains__
    text = values[0]
    if op in _NUM_CMP:
        cmp = partial(_NUM_CMP[op], _convert(text, FieldType.INT, ctx, name))
        if ftype in _NUMERIC:
            return cmp
        return lambda x: (n := _to_int(x)) is not None and cmp(n)
    if op in ("=", "==", "!=") and ftype not in (FieldType.STRING, FieldType.LIST):
        v = _convert(text, ftype, ctx, name)
        test = _ip_eq(v) if ftype in _IP else partial(operator.eq, v)
        return test if op != "!=" else lambda x: not test(x)
    test_s = _string_test(op, text, ctx)
    if ftype in (FieldType.STRING, FieldType.LIST):
        return test_s
    # A string operator on a typed field: compare its printed form.
    return lambda x: test_s(to_text(x))


def _lift(get: Getter, test: Callable[[Any], bool]) -> Predicate:
    """None -> false; a list value -> true if any element passes (proc.aname semantics)."""

    def pred(ev: Any) -> bool:
        v = get(ev)
        if v is None:
            return False
        if v.__class__ in _SEQ:
            # explicit loops here and below: measurably faster than any()/all() on hot paths
            for x in v:  # noqa: SIM110
                if x is not None and test(x):
                    return True
            return False
        return test(v)

    return pred


_FIELD_CMP: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq, "==": operator.eq, "!=": operator.ne, "<": operator.lt,
    "<=": operator.le, ">": operator.gt, ">=": operator.ge,
    "contains": lambda a, b: to_text(b) in to_text(a),
    "icontains": lambda a, b: to_text(b).lower() in to_text(a).lower(),
    "startswith": lambda a, b: to_text(a).startswith(to_text(b)),
    "endswith": lambda a, b: to_text(a).endswith(to_text(b)),
}


def _field_to_field(
    check: BinaryCheck, left: Getter, registry: FieldRegistry, ctx: ItemContext | None
) -> Predicate:
    assert isinstance(check.value, FieldValue)
    cmp = _FIELD_CMP.get(check.op)
    if cmp is None:
        raise UnsupportedOperatorError(
            f"operator '{check.op}' is not supported with a field on the right", ctx
        )
    right = make_getter(resolve_field(registry, check.value.field, ctx))

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


def _compile_check(
    check: UnaryCheck | BinaryCheck, registry: FieldRegistry, ctx: ItemContext | None
) -> Predicate:
    fld = resolve_field(registry, check.field, ctx)
    get = make_getter(fld)
    if isinstance(check, UnaryCheck):
        return lambda ev: (v := get(ev)) is not None and v != []
    if isinstance(check.value, FieldValue):
        return _field_to_field(check, get, registry, ctx)
    return _lift(get, _scalar_test(check.op, check.value, fld, ctx))


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
    missing: set[str] = set()
    for ref in field_refs(node):
        try:
            resolve_field(registry, ref, None)
        except UnknownFieldError:
            missing.add(ref.name)
        except RuleLoadError:
            pass
    return sorted(missing)
