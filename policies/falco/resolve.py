"""Fields as a condition names them, looked up in the registry, with the type
each transformer takes and yields (libsinsp's rules). The bottom of the
compiler: ``transformers``, ``calls``, ``typecheck`` and ``operators`` build on it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from policies.falco.fieldapi import ArgKind, FieldRegistry, FieldSpec, FieldType
from policies.falco.grammar import FieldRef
from policies.falco.loader import FieldTypeError, ItemContext, UnknownFieldError

NUMERIC = (FieldType.INT, FieldType.PORT, FieldType.RELTIME, FieldType.ABSTIME)
IP_TYPES = (FieldType.IPADDR, FieldType.IPNET)

# What each transformer takes (libsinsp: charbuf and paths; b64 and len also
# byte buffers; len any list) and ``len`` yields a number.
_TEXT = frozenset({FieldType.STRING, FieldType.LIST})
_INPUTS: dict[str, frozenset[FieldType]] = {
    "tolower": _TEXT,
    "toupper": _TEXT,
    "basename": _TEXT,
    "b64": _TEXT | {FieldType.BYTES},
    "len": _TEXT | {FieldType.BYTES},
}


@dataclass(frozen=True, slots=True)
class ResolvedField:
    spec: FieldSpec
    arg: str | int | None
    ref: FieldRef
    # A list of values (a list field, an indexable one used whole, a getopt result).
    is_list: bool = False

    @property
    def type(self) -> FieldType:
        """The value type after transformers."""
        return transformed_type(self.spec.type, self.ref, None)


def transformed_type(ftype: FieldType, ref: FieldRef, ctx: ItemContext | None) -> FieldType:
    """The type after ``ref``'s transformers, innermost first; refuse a
    transformer over a type libsinsp does not let it take."""
    for name in reversed(ref.transformers):
        if ftype not in _INPUTS[name]:
            raise FieldTypeError(
                f"transformer '{name}' cannot be applied to {ftype.value} field '{ref.name}'", ctx
            )
        ftype = FieldType.INT if name == "len" else ftype
    return ftype


def _parse_arg(arg: str | None) -> str | int | None:
    if arg is not None and re.fullmatch(r"-?[0-9]+", arg):
        return int(arg)
    return arg


def resolve_plain(registry: FieldRegistry, ref: FieldRef, ctx: ItemContext | None) -> ResolvedField:
    """A registry field (no call), with Falco's ``evt.arg.X`` == ``evt.arg[X]`` prefix rule."""
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
    if spec.index_arg and arg is not None and not re.fullmatch(r"[0-9]+", arg):
        raise FieldTypeError(f"field '{ref.name}' takes a numeric index, not '{arg}'", ctx)
    transformed_type(spec.type, ref, ctx)
    whole = spec.arg is ArgKind.OPTIONAL and arg is None
    is_list = (spec.type is FieldType.LIST or whole) and "len" not in ref.transformers
    return ResolvedField(spec, _parse_arg(arg), ref, is_list)


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
