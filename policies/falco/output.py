"""Rule output templates: ``%field`` and ``%field[arg]`` rendered as Falco does.

Falco's formatter scans for ``%``, optionally reads a width (``%20proc.name``
pads to 20 columns), then takes the longest field expression that compiles.
A value the event does not carry prints as ``<NA>`` (Falco's rules run with
that behaviour), lists print as ``(a,b,c)``, booleans as ``true``/``false``.

Deviation, on purpose: a field our registry does not know is not a load
error here (Falco would reject it); it renders ``<NA>`` and is reported in
``OutputTemplate.unknown_fields`` so validation can name it. Detection does
not depend on output fields, so one missing field should not drop a rule.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any

from policies.falco.compiler import Getter, make_getter, resolve_field, to_text
from policies.falco.fieldapi import FieldRegistry
from policies.falco.grammar import FieldRef
from policies.falco.loader import RuleLoadError

NA = "<NA>"

# The fields every alert carries in output_fields (DESIGN: alert JSON contract).
ALWAYS_FIELDS = ("container.id", "container.full_id", "proc.cmdline", "proc.pid")

_TOKEN = re.compile(
    r"(?P<width>[0-9]+)?"
    r"(?P<transformers>(?:(?:tolower|toupper|b64|basename|len)\()*)"
    r"(?P<name>[a-zA-Z]+[a-zA-Z0-9_]*(?:\.[a-zA-Z]+[a-zA-Z0-9_]*)+)"
    r"(?P<arg>\[[^\]]*\])?"
)


@dataclass(frozen=True, slots=True)
class _Field:
    key: str  # as written in the template, e.g. "proc.aname[2]"
    getter: Getter | None  # None: unknown to the registry
    width: int


def _printable(text: str) -> str:
    # Undecodable bytes were kept as surrogates for matching; print them as U+FFFD.
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def format_value(value: Any) -> str:
    """One value as Falco prints it in the output line."""
    if value is None:
        return NA
    if isinstance(value, (list, tuple)):
        return "(" + ",".join(format_value(v) for v in value) + ")"
    return _printable(to_text(value))


def json_value(value: Any) -> Any:
    """One value as it goes into ``output_fields`` (JSON-compatible)."""
    if isinstance(value, str):
        return _printable(value)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    if isinstance(value, (ipaddress.IPv4Address, ipaddress.IPv6Address)):
        return str(value)
    return to_text(value)


def _close_transformers(text: str, pos: int, count: int) -> int | None:
    """Position after ``count`` closing parentheses (blanks allowed), or None."""
    for _ in range(count):
        while pos < len(text) and text[pos] == " ":
            pos += 1
        if pos >= len(text) or text[pos] != ")":
            return None
        pos += 1
    return pos


class OutputTemplate:
    """A parsed output template bound to a registry."""

    def __init__(self, template: str, registry: FieldRegistry) -> None:
        self.template = template
        self.parts: list[str | _Field] = []
        self.unknown_fields: list[str] = []
        self._parse(template, registry)
        self.fields: tuple[_Field, ...] = tuple(p for p in self.parts if isinstance(p, _Field))

    def _parse(self, text: str, registry: FieldRegistry) -> None:
        literal: list[str] = []
        i = 0
        while i < len(text):
            c = text[i]
            m = _TOKEN.match(text, i + 1) if c == "%" else None
            if m is None:
                literal.append(c)
                i += 1
                continue
            transformers = [t for t in m.group("transformers").split("(") if t]
            end = _close_transformers(text, m.end(), len(transformers))
            if end is None:
                literal.append(c)
                i += 1
                continue
            if literal:
                self.parts.append("".join(literal))
                literal = []
            self.parts.append(self._field(m, transformers, text[i + 1 : end], registry))
            i = end
        if literal:
            self.parts.append("".join(literal))

    def _field(
        self, m: re.Match[str], transformers: list[str], written: str, registry: FieldRegistry
    ) -> _Field:
        arg = m.group("arg")
        ref = FieldRef(m.group("name"), arg[1:-1] if arg else None, tuple(transformers))
        width = int(m.group("width") or 0)
        key = written[len(m.group("width") or "") :]
        try:
            getter: Getter | None = make_getter(resolve_field(registry, ref, None))
        except RuleLoadError:
            getter = None
            self.unknown_fields.append(ref.name)
        return _Field(key, getter, width)

    def values(self, event: Any) -> dict[str, Any]:
        """The raw (normalised) value of every field of the template."""
        return {f.key: (f.getter(event) if f.getter else None) for f in self.fields}

    def render(self, event: Any, values: dict[str, Any] | None = None) -> str:
        vals = values if values is not None else self.values(event)
        out: list[str] = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
                continue
            text = format_value(vals.get(part.key))
            out.append(text.ljust(part.width)[: part.width] if part.width else text)
        return "".join(out)


class ExtraFields:
    """Getters for the fields every alert carries, when the registry has them."""

    def __init__(self, registry: FieldRegistry, names: tuple[str, ...] = ALWAYS_FIELDS) -> None:
        self.getters: list[tuple[str, Getter]] = []
        for name in names:
            try:
                resolved = resolve_field(registry, FieldRef(name), None)
                self.getters.append((name, make_getter(resolved)))
            except RuleLoadError:
                continue

    def values(self, event: Any) -> dict[str, Any]:
        return {name: get(event) for name, get in self.getters}
