"""The contract between the condition compiler and the event source.

The compiler (``compiler.py``) knows nothing about syscalls: it asks a
``FieldRegistry`` whether a field exists, what type it has, whether it takes
an argument, and for a function that pulls the value out of an event. The
sensor side (``fields.py`` over ``event.py``) fills the registry. A rule that
names a field the registry does not know is rejected with the field's name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any


class FieldType(str, Enum):  # noqa: UP042 (contract: str() stays the enum name)
    """Value types, after Falco's (``falco --list`` prints these)."""

    STRING = "string"
    INT = "int"  # int64/uint64 in Falco
    BOOL = "bool"
    LIST = "list"  # a list of strings (proc.aname without argument, evt.args...)
    BYTES = "bytes"  # a byte buffer (evt.buffer, evt.arg.data): libsinsp's PT_BYTEBUF
    IPADDR = "ipaddr"
    IPNET = "ipnet"
    PORT = "port"
    RELTIME = "reltime"
    ABSTIME = "abstime"


class ArgKind(str, Enum):  # noqa: UP042
    NONE = "none"  # proc.name
    OPTIONAL = "optional"  # proc.aname or proc.aname[2]
    REQUIRED = "required"  # evt.arg[flags] / evt.arg.flags, proc.apid[1]


# An extractor gets the event and the field's argument (None, an int index or a
# string key, as written in the rule) and returns the value, or None when the
# event does not carry it (Falco's "<NA>": comparisons with it are false).
Extractor = Callable[[Any, "str | int | None"], Any]


@dataclass(frozen=True, slots=True)
class FieldSpec:
    name: str
    type: FieldType
    extractor: Extractor
    arg: ArgKind = ArgKind.NONE
    description: str = ""
    # Fields over both ends of a socket (fd.ip, fd.port, ...): the extractor returns
    # both values; ``=`` holds when either end equals, ``!=`` when neither does.
    both_ends: bool = False
    # The argument is a number (proc.aname[2], fd.types[3]); anything else is refused.
    index_arg: bool = False


class FieldRegistry:
    """Name -> FieldSpec, with Falco's longest-prefix lookup for ``evt.arg.X``."""

    def __init__(self, specs: Iterable[FieldSpec] = (), unserved: Iterable[str] = ()) -> None:
        self._specs: dict[str, FieldSpec] = {}
        # Falco's fields whose data this event source lacks: refused by name.
        self.unserved = frozenset(unserved)
        for spec in specs:
            self.add(spec)

    def add(self, spec: FieldSpec) -> None:
        self._specs[spec.name] = spec

    def get(self, name: str) -> FieldSpec | None:
        return self._specs.get(name)

    def names(self) -> list[str]:
        return sorted(self._specs)

    def __contains__(self, name: object) -> bool:
        return name in self._specs
