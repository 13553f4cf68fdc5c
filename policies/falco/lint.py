"""libsinsp's compile warnings on a condition's constant values.

libsinsp's filter compiler warns (Falco reports them as
``LOAD_COMPILE_CONDITION`` warnings) when a constant looks like a mistake: a
value that names a field (``evt.source = evt.plugininfo``: ``val()`` was
meant), a value written like a transformer call (``'tolower(fd.name)'``), or a
``regex`` that a plain operator could do (``regex '.*ssh'``). The heuristics
below are the same ones, on the same values: every constant on the right of a
comparison, list items included.
"""

from __future__ import annotations

import re

from policies.falco.expand import iter_checks
from policies.falco.fieldapi import FieldRegistry
from policies.falco.grammar import (
    CALLS,
    TRANSFORMERS,
    BinaryCheck,
    ConditionParseError,
    ListValue,
    Node,
    Value,
    field_ref,
)
from policies.falco.loader import RuleLoadError
from policies.falco.resolve import resolve_plain

_REGEX_SPECIAL = set(".+*?^$()[]{}|\\")
_SUGGESTED = "'=', 'contains', 'startswith', 'endswith'"
_FUNCTIONS = ("val", *TRANSFORMERS, *CALLS)


def condition_warnings(node: Node, registry: FieldRegistry) -> list[str]:
    """The warnings libsinsp's compiler gives for an (expanded) condition."""
    found: list[str] = []
    for check in iter_checks(node):
        if not isinstance(check, BinaryCheck):
            continue
        rhs = check.value
        values = (
            rhs.items if isinstance(rhs, ListValue) else (rhs,) if isinstance(rhs, Value) else ()
        )
        for value in values:
            found += value_warnings(check.op, value.text, registry)
    return found


def value_warnings(op: str, text: str, registry: FieldRegistry) -> list[str]:
    found: list[str] = []
    if op == "regex" and _simple_regex(text):
        found.append(f"regex check with '{text}' may be optimized with simpler operators "
                     f"such as {_SUGGESTED}")  # fmt: skip
    compact = re.sub(r"[ \t\n\v\f\r]", "", text)
    if _names_field(compact, registry):
        found.append(f"'{text}' may be a valid field misused as a const string value")
    for name in _FUNCTIONS:
        if len(compact) >= len(name) + 2 and compact.startswith(name + "(") and compact[-1] == ")":
            found.append(
                f"'{text}' may be a valid field transformer misused as a const string value"
            )
    return found


def _simple_regex(text: str) -> bool:
    """No regex syntax beyond anchors and a leading or trailing ``.*``/``.+``/``.?``."""
    n = len(text)
    i = 0
    while i < n:
        c = text[i]
        if (i == 0 and c == "^") or (i == n - 1 and c == "$"):
            i += 1
            continue
        at_edge = (i == 0 and n > 1) or i == n - 2
        if at_edge and c == "." and i + 1 < n and text[i + 1] in "+*?":
            i += 2
            continue
        if c in _REGEX_SPECIAL:
            return False
        i += 1
    return True


def _names_field(text: str, registry: FieldRegistry) -> bool:
    if not text:
        return False
    try:
        ref = field_ref(text)
        if ref.args is not None or ref.transformers:
            return False
        resolve_plain(registry, ref, None)
    except (ConditionParseError, RuleLoadError):
        return False
    return True
