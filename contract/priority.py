"""Falco's priorities, once: what rules declare, alerts carry and responses match.

The values are the spelling Falco's JSON output uses ("Warning",
"Informational", ...). Comparison is by severity, not alphabetically
(``Priority.CRITICAL > Priority.WARNING``), which is why the operators are
overridden. Parsing is case-insensitive with the aliases Falco and
Falcosidekick accept ("info", "warn", "err").
"""

from __future__ import annotations

from enum import StrEnum


class Priority(StrEnum):
    """A Falco priority, most severe first in declaration order."""

    EMERGENCY = "Emergency"
    ALERT = "Alert"
    CRITICAL = "Critical"
    ERROR = "Error"
    WARNING = "Warning"
    NOTICE = "Notice"
    INFORMATIONAL = "Informational"
    DEBUG = "Debug"

    @property
    def severity(self) -> int:
        """0 for Debug up to 7 for Emergency."""
        return _SEVERITY[self]

    @property
    def falco_name(self) -> str:
        """The spelling Falco puts in alerts and rule listings."""
        return self.value

    @classmethod
    def parse(cls, value: object) -> Priority:
        """The priority `value` names; ValueError naming the value otherwise."""
        if isinstance(value, Priority):
            return value
        if not isinstance(value, str):
            raise ValueError(f"priority must be a string, got {type(value).__name__}")
        found = _BY_NAME.get(value.strip().lower())
        if found is None:
            names = ", ".join(p.value for p in cls)
            raise ValueError(f"unknown priority {value!r} (one of {names})")
        return found

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Priority):
            return NotImplemented
        return self.severity < other.severity

    def __le__(self, other: object) -> bool:
        if not isinstance(other, Priority):
            return NotImplemented
        return self.severity <= other.severity

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, Priority):
            return NotImplemented
        return self.severity > other.severity

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, Priority):
            return NotImplemented
        return self.severity >= other.severity

    # Enum members with overridden ordering still hash as their value.
    __hash__ = str.__hash__


_SEVERITY = {p: 7 - i for i, p in enumerate(Priority)}
_BY_NAME: dict[str, Priority] = {p.value.lower(): p for p in Priority}
_BY_NAME.update({"info": Priority.INFORMATIONAL, "warn": Priority.WARNING, "err": Priority.ERROR})
