"""Fields with their transformer calls resolved: ``join``, ``concat``, ``getopt``
(Falco 0.44) and single-value transformers over constants.

``join(sep, list)`` joins a list's values with ``sep``; ``concat(a, b, ...)``
concatenates strings; ``getopt(args, optstring)`` reads a list of arguments
the way getopt(3) does and yields option characters and their values
(``?`` for an unknown option, an empty value for a missing argument), or
with a selector (``getopt(...)[t]``) the value of the last ``-t``. Arguments
are fields (possibly transformed), calls, quoted strings, numbers, and
parenthesised lists of those. The result is an ordinary field for the
compiler: a ``ResolvedField`` over a synthetic spec. libsinsp's verdicts on
argument counts and kinds are kept, message for message where it has one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from policies.falco.fieldapi import FieldRegistry, FieldSpec, FieldType
from policies.falco.grammar import CALLS, TRANSFORMERS, ArgList, CallArg, FieldRef, Value
from policies.falco.loader import FieldTypeError, ItemContext
from policies.falco.resolve import ResolvedField, resolve_plain, transformed_type
from policies.falco.transformers import SEQ, Getter, make_getter, to_text, transform


def resolve_field(registry: FieldRegistry, ref: FieldRef, ctx: ItemContext | None) -> ResolvedField:
    """A field as written, calls included, checked against the registry."""
    if ref.args is not None:
        return resolve_call(registry, ref, ctx)
    return resolve_plain(registry, ref, ctx)


class _Arg:
    """One argument: its getter, whether it yields a list, and its value type."""

    def __init__(self, get: Getter, is_list: bool, ftype: FieldType) -> None:
        self.get = get
        self.is_list = is_list
        self.type = ftype


def _constant(text: str) -> _Arg:
    return _Arg(lambda _ev: text, False, FieldType.STRING)


def _argument(registry: FieldRegistry, arg: CallArg, ctx: ItemContext | None) -> _Arg:
    if isinstance(arg, Value):
        return _constant(arg.text)
    if isinstance(arg, ArgList):
        items = [_argument(registry, a, ctx) for a in arg.items]
        return _Arg(_list_getter(items), True, FieldType.STRING)
    fld = resolve_field(registry, arg, ctx)
    return _Arg(make_getter(fld), fld.is_list, fld.type)


def _list_getter(items: list[_Arg]) -> Getter:
    def get(ev: Any) -> list[str] | None:
        out: list[str] = []
        for item in items:
            value = item.get(ev)
            if value is None:
                return None
            out += [to_text(v) for v in value] if isinstance(value, SEQ) else [to_text(value)]
        return out

    return get


def _as_list(value: Any) -> list[str] | None:
    if value is None:
        return None
    return [to_text(v) for v in value] if isinstance(value, SEQ) else [to_text(value)]


Extract = Callable[[Any], Any]


def _join(args: list[_Arg], ref: FieldRef, ctx: ItemContext | None) -> Extract:
    if len(args) != 2:
        raise FieldTypeError("join() requires exactly 2 arguments: separator and list", ctx)
    sep, items = args
    if sep.is_list:
        raise FieldTypeError(
            "join() first argument (separator) must be a single value, not a list", ctx
        )
    if not items.is_list:
        raise FieldTypeError("join() second argument must be a list", ctx)

    def get(ev: Any) -> str | None:
        s, values = sep.get(ev), _as_list(items.get(ev))
        return None if s is None or values is None else to_text(s).join(values)

    return get


def _concat(args: list[_Arg], ref: FieldRef, ctx: ItemContext | None) -> Extract:
    if len(args) < 2:
        raise FieldTypeError("concat() requires at least 2 arguments", ctx)
    if any(a.is_list or a.type is not FieldType.STRING for a in args):
        raise FieldTypeError("concat() arguments must be strings", ctx)

    def get(ev: Any) -> str | None:
        parts = [a.get(ev) for a in args]
        return None if any(p is None for p in parts) else "".join(map(to_text, parts))

    return get


def _getopt(args: list[_Arg], ref: FieldRef, ctx: ItemContext | None) -> Extract:
    if len(args) != 2:
        raise FieldTypeError("getopt() requires exactly 2 arguments: args list and optstring", ctx)
    argv, optstring = args
    if not argv.is_list:
        raise FieldTypeError("getopt() first argument must be a list", ctx)
    if optstring.is_list:
        raise FieldTypeError("getopt() second argument (optstring) must be a single value", ctx)
    if FieldType.STRING not in (argv.type, optstring.type) or argv.type != optstring.type:
        raise FieldTypeError("getopt() arguments must be strings", ctx)
    if ref.arg is not None and len(ref.arg) != 1:
        raise FieldTypeError("getopt() field argument must be a single option character", ctx)
    selector = ref.arg

    def get(ev: Any) -> Any:
        values, spec = _as_list(argv.get(ev)), optstring.get(ev)
        if values is None or spec is None:
            return None
        found = scan_options(values, to_text(spec))
        if selector is None:
            out: list[str] = []
            for opt in found:
                if opt.missing:  # an empty value, without the option's name
                    out.append("")
                elif opt.value is None:
                    out.append(opt.name)
                else:
                    out += [opt.name, opt.value]
            return out
        picked = [opt.value if opt.value is not None else opt.name for opt in found
                  if opt.name == selector]  # fmt: skip
        return picked[-1] if picked else None

    return get


class Option(NamedTuple):
    name: str  # the option character, "?" for an unknown one
    value: str | None  # its argument, None for an option without one
    missing: bool = False  # it takes an argument and argv ended (value is "")


def scan_options(argv: list[str], optstring: str) -> list[Option]:
    """The options in order, by getopt(3)'s rules as libsinsp applies them: stop
    at ``--`` and at the first operand, skip long options, expand ``-nt``
    clusters, ``?`` for an unknown option."""
    spec = optstring[1:] if optstring.startswith(":") else optstring
    valid: set[str] = set()
    takes_arg: set[str] = set()
    i = 0
    while i < len(spec):
        if spec[i] != ":":
            valid.add(spec[i])
            if spec[i + 1 : i + 2] == ":":
                takes_arg.add(spec[i])
                i += 1
        i += 1
    found: list[Option] = []
    index = 0
    while index < len(argv):
        token = argv[index]
        if token == "--":
            break
        if token.startswith("--"):
            index += 1
            continue
        if not token.startswith("-") or token == "-":
            break
        for pos, opt in enumerate(token[1:], start=1):
            if opt not in valid:
                found.append(Option("?", None))
                continue
            if opt not in takes_arg:
                found.append(Option(opt, None))
                continue
            if pos + 1 < len(token):
                found.append(Option(opt, token[pos + 1 :]))
            elif index + 1 < len(argv):
                index += 1
                found.append(Option(opt, argv[index]))
            else:
                found.append(Option(opt, "", missing=True))
            break
        index += 1
    return found


def _single(args: list[_Arg], ref: FieldRef, ctx: ItemContext | None) -> Extract:
    """A one-value transformer over a constant or a list: ``toupper("abc")``."""
    if ref.arg is not None:
        raise FieldTypeError(f"transformer '{ref.name}' does not support field arguments", ctx)
    if len(args) != 1:
        raise FieldTypeError(f"transformer '{ref.name}' takes one argument", ctx)
    [inner] = args
    name = ref.name

    def get(ev: Any) -> Any:
        value = inner.get(ev)
        return None if value is None else transform(name, value)

    return get


_CALLS = {"join": _join, "concat": _concat, "getopt": _getopt}


def resolve_call(registry: FieldRegistry, ref: FieldRef, ctx: ItemContext | None) -> ResolvedField:
    """A transformer call as a field of the compiler."""
    assert ref.args is not None
    if ref.name not in CALLS and ref.name not in TRANSFORMERS:
        raise FieldTypeError(f"unknown transformer '{ref.name}'", ctx)
    args = [_argument(registry, a, ctx) for a in ref.args]
    if ref.name in TRANSFORMERS or len(args) == 1:
        if ref.name in CALLS:  # libsinsp takes one argument as a one-value transformer
            raise FieldTypeError(f"'{ref.name}' is not a one-argument transformer", ctx)
        extract = _single(args, ref, ctx)
        [inner] = args
        is_list = inner.is_list and ref.name != "len"
        base = FieldType.LIST if inner.is_list else inner.type
        ftype = transformed_type(base, FieldRef(ref.name, None, (ref.name,)), ctx)
    else:
        extract = _CALLS[ref.name](args, ref, ctx)
        is_list = ref.name == "getopt" and ref.arg is None
        ftype = FieldType.LIST if is_list else FieldType.STRING
    transformed_type(ftype, ref, ctx)  # the transformers around the call
    spec = FieldSpec(ref.text(), ftype, lambda ev, _arg: extract(ev))
    return ResolvedField(spec, None, ref, is_list and "len" not in ref.transformers)
