"""Field values as the engine compares them: normalised per type, then transformed."""

from __future__ import annotations

import base64
import binascii
import ipaddress
from collections.abc import Callable
from typing import Any

from policies.falco.fieldapi import FieldType
from policies.falco.resolve import ResolvedField, parse_number

Getter = Callable[[Any], Any]
SEQ = (list, tuple)


# libsinsp changes case byte by byte with C's toupper/tolower: ASCII letters only.
_TO_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_TO_UPPER = str.maketrans("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")


def ascii_lower(text: str) -> str:
    return text.translate(_TO_LOWER)


def to_text(value: Any) -> str:
    """A scalar as Falco prints it."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def to_int(value: Any) -> int | None:
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
    FieldType.BYTES: _norm_text,
    FieldType.INT: to_int,
    FieldType.PORT: to_int,
    FieldType.RELTIME: to_int,
    FieldType.ABSTIME: to_int,
    FieldType.BOOL: _to_bool,
    FieldType.IPADDR: _to_ip,
    FieldType.IPNET: _to_ip,
}
_PYTYPE: dict[FieldType, type] = {
    FieldType.STRING: str,
    FieldType.LIST: str,
    FieldType.INT: int,
    FieldType.PORT: int,
    FieldType.RELTIME: int,
    FieldType.ABSTIME: int,
    FieldType.BOOL: bool,
}


def _byte_len(value: Any) -> int | None:
    # libsinsp counts bytes; strings hold bytes as UTF-8 with surrogate escapes.
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogateescape"))
    return len(value) if isinstance(value, (bytes, list, tuple)) else None


def transform(name: str, value: Any) -> Any:
    """One single-value transformer over a value (a list: over each item)."""
    if name == "len":
        return _byte_len(value)
    if isinstance(value, SEQ):
        return [transform(name, v) for v in value]
    text = to_text(value)
    if name == "tolower":
        return ascii_lower(text)
    if name == "toupper":
        return text.translate(_TO_UPPER)
    if name == "basename":
        return text.rsplit("/", 1)[-1]
    try:  # b64 (libsinsp decodes without requiring the padding)
        text += "=" * (-len(text) % 4)
        return base64.b64decode(text, validate=True).decode("utf-8", "surrogateescape")
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
        if v.__class__ in SEQ:
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
            v = transform(t, v)
        return v

    return get_transformed
