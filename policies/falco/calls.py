"""Falco 0.44's transformers over several arguments: ``join``, ``concat``, ``getopt``.

``join(sep, list)`` joins a list field's values with ``sep``; ``concat(a, b, ...)``
concatenates string values; ``getopt(args, optstring)`` reads a list of
arguments the way getopt(3) does and yields option names (``-t``) and their
values, or with a selector (``getopt(...)[t]``) the value of the last ``-t``.
Arguments are fields (possibly transformed) or quoted strings. The result is
an ordinary field for the compiler: a ``ResolvedField`` over a synthetic spec.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from policies.falco.fieldapi import ArgKind, FieldRegistry, FieldSpec, FieldType
from policies.falco.grammar import FieldRef, Value
from policies.falco.loader import FieldTypeError, ItemContext
from policies.falco.transformers import SEQ, Getter, make_getter, to_text
from policies.falco.typecheck import ResolvedField, resolve_field, transformed_type


class _Arg:
    """One argument: its getter, and whether it yields a list."""

    def __init__(self, get: Getter, is_list: bool, is_text: bool) -> None:
        self.get = get
        self.is_list = is_list
        self.is_text = is_text


def _argument(registry: FieldRegistry, arg: FieldRef | Value, ctx: ItemContext | None) -> _Arg:
    if isinstance(arg, Value):
        text = arg.text
        return _Arg(lambda _ev: text, False, True)
    fld = resolve_field(registry, arg, ctx)
    ftype = fld.type
    # A list: a list-typed field, or an indexable one used whole (fd.types, proc.aname).
    whole = fld.spec.arg is ArgKind.OPTIONAL and fld.arg is None and not arg.transformers
    return _Arg(make_getter(fld), ftype is FieldType.LIST or whole,
                ftype in (FieldType.STRING, FieldType.LIST))  # fmt: skip


def _as_list(value: Any) -> list[str] | None:
    if value is None:
        return None
    return [to_text(v) for v in value] if isinstance(value, SEQ) else [to_text(value)]


def _join(args: list[_Arg], ref: FieldRef, ctx: ItemContext | None) -> Callable[[Any], Any]:
    if len(args) != 2:
        raise FieldTypeError("join() requires exactly 2 arguments: separator and list", ctx)
    sep, items = args
    if sep.is_list or not items.is_list:
        raise FieldTypeError("join() takes a single separator and then a list", ctx)

    def get(ev: Any) -> str | None:
        s, values = sep.get(ev), _as_list(items.get(ev))
        return None if s is None or values is None else to_text(s).join(values)

    return get


def _concat(args: list[_Arg], ref: FieldRef, ctx: ItemContext | None) -> Callable[[Any], Any]:
    if len(args) < 2:
        raise FieldTypeError("concat() requires at least 2 arguments", ctx)
    if any(a.is_list or not a.is_text for a in args):
        raise FieldTypeError("concat() arguments must be strings", ctx)

    def get(ev: Any) -> str | None:
        parts = [a.get(ev) for a in args]
        return None if any(p is None for p in parts) else "".join(map(to_text, parts))

    return get


def _getopt(args: list[_Arg], ref: FieldRef, ctx: ItemContext | None) -> Callable[[Any], Any]:
    if len(args) != 2:
        raise FieldTypeError("getopt() requires exactly 2 arguments: args list and optstring", ctx)
    argv, optstring = args
    if not argv.is_list or optstring.is_list or not optstring.is_text:
        raise FieldTypeError("getopt() takes a list of strings and then an optstring", ctx)
    if ref.arg is not None and len(ref.arg) != 1:
        raise FieldTypeError("getopt() field argument must be a single option character", ctx)
    selector = ref.arg

    def get(ev: Any) -> Any:
        values, spec = _as_list(argv.get(ev)), optstring.get(ev)
        if values is None or spec is None:
            return None
        found = scan_options(values, to_text(spec))
        if selector is None:
            return [
                text for name, value in found for text in (f"-{name}", value) if text is not None
            ]
        picked = [value if value is not None else f"-{name}" for name, value in found
                  if name == selector]  # fmt: skip
        return picked[-1] if picked else None

    return get


def scan_options(argv: list[str], optstring: str) -> list[tuple[str, str | None]]:
    """(option, value or None) in order, with getopt(3)'s stopping rules: stop at
    ``--`` and at the first operand, skip long options, expand ``-nt`` clusters."""
    takes_arg = {c for i, c in enumerate(optstring) if c != ":" and optstring[i + 1 : i + 2] == ":"}
    valid = set(optstring) - {":"}
    found: list[tuple[str, str | None]] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--" or not token.startswith("-") or token == "-":
            break
        if token.startswith("--"):
            i += 1
            continue
        for pos, opt in enumerate(token[1:], start=1):
            if opt not in valid:
                continue
            if opt in takes_arg:
                rest = token[pos + 1 :]
                if not rest and i + 1 < len(argv):
                    i += 1
                    rest = argv[i]
                found.append((opt, rest or None))
                break
            found.append((opt, None))
        i += 1
    return found


_CALLS = {"join": _join, "concat": _concat, "getopt": _getopt}


def resolve_call(registry: FieldRegistry, ref: FieldRef, ctx: ItemContext | None) -> ResolvedField:
    """A join/concat/getopt expression as a field of the compiler."""
    assert ref.args is not None
    build = _CALLS.get(ref.name)
    if build is None:
        raise FieldTypeError(f"unknown transformer '{ref.name}'", ctx)
    args = [_argument(registry, a, ctx) for a in ref.args]
    extract = build(args, ref, ctx)
    ftype = FieldType.LIST if ref.name == "getopt" and ref.arg is None else FieldType.STRING
    transformed_type(ftype, ref, ctx)
    spec = FieldSpec(ref.text(), ftype, lambda ev, _arg: extract(ev))
    return ResolvedField(spec, None, ref)
