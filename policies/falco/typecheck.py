"""Fields as a condition names them, checked against the registry, and values
converted to the field's type, as libsinsp's filter compiler does."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any

from policies.falco.fieldapi import ArgKind, FieldRegistry, FieldSpec, FieldType
from policies.falco.grammar import FieldRef
from policies.falco.loader import (
    FieldTypeError,
    ItemContext,
    UnknownFieldError,
)

NUMERIC = (FieldType.INT, FieldType.PORT, FieldType.RELTIME, FieldType.ABSTIME)
IP_TYPES = (FieldType.IPADDR, FieldType.IPNET)
_TEXT = (FieldType.STRING, FieldType.LIST)

# The operators libsinsp accepts per field type (strings take every operator).
_EQUALITY = frozenset({"=", "==", "!=", "in", "intersects", "exists"})
_ORDERED = _EQUALITY | {"<", "<=", ">", ">="}
_OPERATORS: dict[FieldType, frozenset[str]] = {
    FieldType.LIST: frozenset({"in", "intersects", "exists"}),
    FieldType.BOOL: _EQUALITY,
    FieldType.IPADDR: _EQUALITY,
    FieldType.IPNET: _EQUALITY,
    **{t: _ORDERED for t in NUMERIC},
}


@dataclass(frozen=True, slots=True)
class ResolvedField:
    spec: FieldSpec
    arg: str | int | None
    ref: FieldRef

    @property
    def type(self) -> FieldType:
        """The value type after transformers."""
        return transformed_type(self.spec.type, self.ref, None)


def transformed_type(ftype: FieldType, ref: FieldRef, ctx: ItemContext | None) -> FieldType:
    """The type after ``ref``'s transformers, innermost first; libsinsp applies
    them to string (and list) values only, and ``len`` yields a number."""
    for name in reversed(ref.transformers):
        if ftype not in _TEXT:
            raise FieldTypeError(
                f"transformer '{name}' cannot be applied to {ftype.value} field '{ref.name}'", ctx
            )
        ftype = FieldType.INT if name == "len" else ftype
    return ftype


def check_operator(fld: ResolvedField, op: str, ctx: ItemContext | None) -> None:
    """Refuse an operator the field's type does not support (libsinsp's verdict)."""
    allowed = _OPERATORS.get(fld.type)
    if allowed is not None and op not in allowed:
        raise FieldTypeError(
            f"operator '{op}' is not supported on {fld.type.value} field '{fld.ref.text()}'", ctx
        )


def _parse_arg(arg: str | None) -> str | int | None:
    if arg is not None and re.fullmatch(r"-?[0-9]+", arg):
        return int(arg)
    return arg


def resolve_field(registry: FieldRegistry, ref: FieldRef, ctx: ItemContext | None) -> ResolvedField:
    """Look a field up, with Falco's ``evt.arg.X`` == ``evt.arg[X]`` prefix rule."""
    if ref.args is not None:
        from policies.falco.calls import resolve_call  # calls builds on this module

        return resolve_call(registry, ref, ctx)
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
        raise unknown_field(registry, ref.name, ctx)
    if spec.arg is ArgKind.NONE and arg is not None:
        raise FieldTypeError(f"field '{ref.name}' does not take an argument", ctx)
    if spec.arg is ArgKind.REQUIRED and arg is None:
        raise FieldTypeError(f"field '{ref.name}' requires an argument", ctx)
    transformed_type(spec.type, ref, ctx)
    return ResolvedField(spec, _parse_arg(arg), ref)


def unknown_field(
    registry: FieldRegistry, name: str, ctx: ItemContext | None, code: str = ""
) -> UnknownFieldError:
    """The error for a field the registry lacks, saying whether Falco has it."""
    served = name not in registry.unserved
    why = "not in the field registry" if served else "a Falco field this sensor cannot serve"
    err = UnknownFieldError(name, ctx, why)
    err.code = code or err.code
    return err


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


def convert(text: str, ftype: FieldType, ctx: ItemContext | None, name: str) -> Any:
    try:
        if ftype in NUMERIC:
            return parse_number(text)
        if ftype is FieldType.BOOL:
            low = text.lower()
            if low in ("true", "1"):
                return True
            if low in ("false", "0"):
                return False
            raise ValueError(text)
        if ftype in IP_TYPES:
            if "/" in text or ftype is FieldType.IPNET:
                return ipaddress.ip_network(text, strict=False)
            return ipaddress.ip_address(text)
    except ValueError:
        raise FieldTypeError(
            f"value '{text}' is not a valid {ftype.value} for field '{name}'", ctx
        ) from None
    return text
