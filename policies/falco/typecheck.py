"""Fields as a condition names them, checked against the registry, and values
converted to the field's type, as libsinsp's filter compiler does."""

from __future__ import annotations

import ipaddress
from typing import Any

from policies.falco.fieldapi import FieldType
from policies.falco.loader import FieldTypeError, ItemContext
from policies.falco.resolve import IP_TYPES, NUMERIC, ResolvedField, parse_number

# The operators libsinsp accepts per field type (strings take every operator but
# the byte ones).
_EQUALITY = frozenset({"=", "==", "!=", "in", "intersects", "exists"})
_ORDERED = _EQUALITY | {"<", "<=", ">", ">="}
_STRING = _ORDERED | {"contains", "icontains", "startswith", "endswith", "glob", "iglob",
                      "pmatch", "regex"}  # fmt: skip
_OPERATORS: dict[FieldType, frozenset[str]] = {
    FieldType.STRING: _STRING,
    FieldType.LIST: frozenset({"in", "intersects", "exists"}),
    FieldType.BOOL: _EQUALITY,
    FieldType.IPADDR: _EQUALITY,
    FieldType.IPNET: _EQUALITY,
    FieldType.BYTES: _EQUALITY | {"contains", "startswith", "endswith", "bcontains", "bstartswith"},
    **{t: _ORDERED for t in NUMERIC},
}


def check_operator(fld: ResolvedField, op: str, ctx: ItemContext | None) -> None:
    """Refuse an operator the field's type does not support (libsinsp's verdict)."""
    allowed = _OPERATORS.get(fld.type)
    if allowed is not None and op not in allowed:
        raise FieldTypeError(
            f"operator '{op}' is not supported on {fld.type.value} field '{fld.ref.text()}'", ctx
        )


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
