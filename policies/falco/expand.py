"""Exceptions to condition text, macro and list expansion, walking the AST.

Falco builds a rule's exceptions into condition text, parses it, then inlines
macros (recursively) and lists inside value lists (recursively, list items
that are quoted strings unquoted). ``compiler.py`` compiles the result.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from policies.falco.grammar import (
    LIST_OPS,
    TRANSFORMERS,
    And,
    ArgList,
    BinaryCheck,
    ConditionParseError,
    FieldRef,
    FieldValue,
    ListValue,
    MacroRef,
    Node,
    Not,
    Or,
    UnaryCheck,
    Value,
    is_modified_operator,
    is_quoted,
    parse_condition,
    quote_value,
    unquote,
)
from policies.falco.loader import (
    ConditionSyntaxError,
    ExceptionInfo,
    ItemContext,
    ListInfo,
    MacroInfo,
    RuleInfo,
    RuleLoadError,
)

# --- exceptions -> condition text ----------------------------------------------


# An exception value that names a field (``val(proc.pname)``, ``tolower(fd.name)``):
# Falco compares with that field's value instead of the literal text.
_FIELD_CALL = re.compile(r"(?:val|" + "|".join(TRANSFORMERS) + r")\(.*\)", re.DOTALL)


def _quote_item(text: str) -> str:
    # Falco quotes items with blanks unless they are already quoted; we also
    # quote other characters a bare value cannot hold, and escape what we quote.
    if is_quoted(text) or _FIELD_CALL.fullmatch(text):
        return text
    return quote_value(text)


def _paren_item(text: str) -> str:
    return text if text.startswith("(") or _FIELD_CALL.fullmatch(text) else f"({text})"


def _exception_text(ex: ExceptionInfo) -> str:
    if not isinstance(ex.fields, list):
        if not ex.values:
            return ""
        items = ", ".join(_quote_item(str(v)) for v in ex.values)
        return f"({ex.fields} {ex.comps} ({items}))"
    comps = ex.comps if isinstance(ex.comps, list) else ["="] * len(ex.fields)
    alternatives = []
    for values in ex.values:
        terms = []
        for fld, comp, val in zip(ex.fields, comps, values, strict=True):
            if isinstance(val, list):
                rhs = "(" + ", ".join(_quote_item(str(v)) for v in val) + ")"
            elif comp in LIST_OPS or is_modified_operator(comp):
                rhs = _paren_item(str(val))
            else:
                rhs = _quote_item(str(val))
            terms.append(f"{fld} {comp} {rhs}")
        alternatives.append("(" + " and ".join(terms) + ")")
    return "(" + " or ".join(alternatives) + ")" if alternatives else ""


def condition_with_exceptions(rule: RuleInfo) -> str:
    """The rule's condition with its exceptions appended as Falco expands them."""
    if not rule.exceptions:
        return rule.condition
    text = f"({rule.condition})"
    for ex in rule.exceptions:
        icond = _exception_text(ex)
        if icond:
            text += f" and not {icond}"
    return text


# --- macro and list expansion ------------------------------------------------------


@dataclass
class Expansion:
    node: Node
    macros: set[str] = field(default_factory=set)
    lists: set[str] = field(default_factory=set)


class Expander:
    """Inlines macros and lists; parsed macro bodies are cached."""

    def __init__(self, lists: Mapping[str, ListInfo], macros: Mapping[str, MacroInfo]) -> None:
        self._lists = lists
        self._macros = macros
        self._parsed: dict[str, Node] = {}
        self._list_values: dict[str, tuple[Value, ...]] = {}

    def parse(self, text: str, ctx: ItemContext) -> Node:
        try:
            return parse_condition(text)
        except ConditionParseError as e:
            raise ConditionSyntaxError(f"invalid condition: {e}", ctx) from None

    def macro_ast(self, name: str) -> Node:
        if name not in self._parsed:
            info = self._macros[name]
            self._parsed[name] = self.parse(info.condition, info.ctx)
        return self._parsed[name]

    def expand(self, text: str, ctx: ItemContext) -> Expansion:
        out = Expansion(self.parse(text, ctx))
        out.node = self._node(out.node, out, ctx, ())
        return out

    def _node(self, node: Node, out: Expansion, ctx: ItemContext, stack: tuple[str, ...]) -> Node:
        if isinstance(node, MacroRef):
            return self._macro(node.name, out, ctx, stack)
        if isinstance(node, Not):
            return Not(self._node(node.child, out, ctx, stack))
        if isinstance(node, (And, Or)):
            children = tuple(self._node(c, out, ctx, stack) for c in node.children)
            return type(node)(children)
        if isinstance(node, BinaryCheck) and (node.op in LIST_OPS or node.modifier):
            return replace(node, value=self._rhs(node.value, out, ctx))
        return node

    def _macro(self, name: str, out: Expansion, ctx: ItemContext, stack: tuple[str, ...]) -> Node:
        if name not in self._macros:
            raise RuleLoadError(f"undefined macro '{name}' used in condition", ctx)
        if name in stack:
            chain = " -> ".join((*stack, name))
            raise RuleLoadError(f"macro '{name}' references itself ({chain})", ctx)
        out.macros.add(name)
        return self._node(self.macro_ast(name), out, ctx, (*stack, name))

    def _rhs(self, rhs: Any, out: Expansion, ctx: ItemContext) -> Any:
        if isinstance(rhs, Value):
            # ``x in some_list`` without parentheses: a list name, else one value.
            if not rhs.quoted and rhs.text in self._lists:
                return ListValue(self._list_items(rhs.text, out, ctx, ()))
            return ListValue((rhs,))
        if isinstance(rhs, ListValue):
            items: list[Value] = []
            for v in rhs.items:
                if not v.quoted and v.text in self._lists:
                    items.extend(self._list_items(v.text, out, ctx, ()))
                else:
                    items.append(v)
            return ListValue(tuple(items))
        return rhs

    def _list_items(
        self, name: str, out: Expansion, ctx: ItemContext, stack: tuple[str, ...]
    ) -> tuple[Value, ...]:
        out.lists.add(name)
        if name in self._list_values:
            out.lists.update(self._nested_lists(name, ()))
            return self._list_values[name]
        if name in stack:
            raise RuleLoadError(f"list '{name}' references itself", ctx)
        values: list[Value] = []
        for item in self._lists[name].items:
            if item in self._lists:
                values.extend(self._list_items(item, out, ctx, (*stack, name)))
            else:
                values.append(_item_value(item, self._lists[name].ctx))
        self._list_values[name] = tuple(values)
        return self._list_values[name]

    def _nested_lists(self, name: str, stack: tuple[str, ...]) -> set[str]:
        found: set[str] = set()
        for item in self._lists[name].items:
            if item in self._lists and item not in stack:
                found.add(item)
                found |= self._nested_lists(item, (*stack, name))
        return found


def _item_value(item: str, ctx: ItemContext) -> Value:
    # List items were pasted into condition text by Falco, so '"(systemd)"' is
    # the quoted string (systemd), not a value with quote characters in it.
    if is_quoted(item):
        try:
            return Value(unquote(item), quoted=True)
        except ConditionParseError as e:
            raise RuleLoadError(f"invalid list item {item}: {e}", ctx) from None
    return Value(item)


# --- walking the AST ---------------------------------------------------------------


def iter_checks(node: Node) -> Iterable[UnaryCheck | BinaryCheck]:
    if isinstance(node, (UnaryCheck, BinaryCheck)):
        yield node
    elif isinstance(node, Not):
        yield from iter_checks(node.child)
    elif isinstance(node, (And, Or)):
        for c in node.children:
            yield from iter_checks(c)


def macro_refs(node: Node) -> list[str]:
    """The macros a (parsed, unexpanded) condition names directly."""
    if isinstance(node, MacroRef):
        return [node.name]
    if isinstance(node, Not):
        return macro_refs(node.child)
    if isinstance(node, (And, Or)):
        return [name for child in node.children for name in macro_refs(child)]
    return []


def field_refs(node: Node) -> list[FieldRef]:
    """Every field reference in the (expanded) condition, in order, with duplicates."""
    refs: list[FieldRef] = []
    for check in iter_checks(node):
        refs += _plain_refs(check.field)
        if isinstance(check, BinaryCheck) and isinstance(check.value, FieldValue):
            refs += _plain_refs(check.value.field)
    return refs


def _plain_refs(ref: FieldRef) -> list[FieldRef]:
    """The registry fields behind a reference (a join/concat/getopt names several)."""
    if ref.args is None:
        return [ref]
    refs: list[FieldRef] = []
    for arg in ref.args:
        items = arg.items if isinstance(arg, ArgList) else (arg,)
        refs += [r for item in items if isinstance(item, FieldRef) for r in _plain_refs(item)]
    return refs


def fields_used(node: Node) -> list[str]:
    """Field names used by the condition, sorted, without arguments."""
    return sorted({r.name for r in field_refs(node)})
