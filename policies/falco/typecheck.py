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
    ItemContext,
    RuleLoadError,
    UnknownFieldError,
    UnsupportedOperatorError,
)

NUMERIC = (FieldType.INT, FieldType.PORT, FieldType.RELTIME, FieldType.ABSTIME)
IP_TYPES = (FieldType.IPADDR, FieldType.IPNET)


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
        raise RuleLoadError(
            f"value '{text}' is not a valid {ftype.value} for field '{name}'", ctx
        ) from None
    return text
