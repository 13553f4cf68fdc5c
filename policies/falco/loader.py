"""Read Falco rule files into lists, macros and rules, applying overrides.

The semantics follow Falco's rule loader (reader + collector): items are
read in order across files; a later definition of the same name replaces
the earlier one but keeps its position; ``override: {key: append|replace}``
(Falco >= 0.36) and the legacy ``append: true`` modify an earlier item;
an item with only ``rule`` and ``enabled`` toggles an earlier rule.
Conditions stay text here: ``compiler.py`` parses and expands them.

YAML is read with every plain scalar kept as a string (as yaml-cpp does for
Falco), so ``items: [010, yes]`` means the strings ``010`` and ``yes``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from contract.errors import CorralError
from contract.priority import Priority

SYSCALL_SOURCE = "syscall"

# Names accepted for list and macro names (libsinsp's RGX_BARESTR / RGX_IDENTIFIER).
_LIST_NAME = re.compile(r"""[^()"'\s=,]+""")
_MACRO_NAME = re.compile(r"[a-zA-Z]+[a-zA-Z0-9_]*")

_RULE_APPENDABLE = ("condition", "output", "desc", "tags", "exceptions")
_RULE_REPLACEABLE = (
    "capture",
    "capture_duration",
    "condition",
    "output",
    "desc",
    "priority",
    "tags",
    "exceptions",
    "enabled",
    "warn_evttypes",
    "skip-if-unknown-filter",
)
_KNOWN_KEYS = {
    "list": {"list", "items", "append", "override"},
    "macro": {"macro", "condition", "append", "override"},
    "rule": {
        "rule",
        "condition",
        "output",
        "desc",
        "priority",
        "tags",
        "enabled",
        "exceptions",
        "source",
        "append",
        "override",
        "warn_evttypes",
        "skip-if-unknown-filter",
        "capture",
        "capture_duration",
    },
}


# --- errors -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ItemContext:
    """Where an item came from, for one-line messages."""

    file: str
    line: int | None
    kind: str  # "rule", "macro", "list", "item", "file"
    name: str = ""

    def describe(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        if self.kind == "file" or not self.name:
            return where if self.kind == "file" else f"{where}: {self.kind}"
        return f"{where}: {self.kind} '{self.name}'"


# Falco's load result codes (falco_load_result.h): errors stop the load,
# warnings are reported and the load goes on.
YAML_PARSE = "LOAD_ERR_YAML_PARSE"
YAML_VALIDATE = "LOAD_ERR_YAML_VALIDATE"
COMPILE_CONDITION = "LOAD_ERR_COMPILE_CONDITION"
COMPILE_OUTPUT = "LOAD_ERR_COMPILE_OUTPUT"
VALIDATE = "LOAD_ERR_VALIDATE"
FILE_READ = "LOAD_ERR_FILE_READ"


class RuleLoadError(CorralError):
    """A rule file could not be loaded; the message names file, item and reason."""

    default_code = VALIDATE

    def __init__(self, reason: str, ctx: ItemContext | None = None, code: str = "") -> None:
        self.reason = reason.replace("\n", " ")
        self.ctx = ctx
        self.code = code or self.default_code
        super().__init__(f"{ctx.describe()}: {self.reason}" if ctx else self.reason)

    @property
    def item_name(self) -> str:
        return self.ctx.name if self.ctx else ""


class ConditionSyntaxError(RuleLoadError):
    """A condition (or an expanded macro) does not parse."""

    default_code = COMPILE_CONDITION


class UnknownFieldError(RuleLoadError):
    """A condition names a field the field registry does not know."""

    default_code = COMPILE_CONDITION

    def __init__(self, field_name: str, ctx: ItemContext | None = None, detail: str = "") -> None:
        self.field = field_name
        why = f"unknown field '{field_name}'" + (f" ({detail})" if detail else "")
        super().__init__(why, ctx)


class UnsupportedOperatorError(RuleLoadError):
    """Falco would accept this, but this engine cannot evaluate it."""

    default_code = COMPILE_CONDITION


class FieldTypeError(RuleLoadError):
    """An operator, transformer, argument or value does not fit the field's type."""

    default_code = COMPILE_CONDITION


class UnknownEventTypeError(FieldTypeError):
    """``evt.type`` compared with a name libsinsp does not know."""


UNKNOWN_SOURCE = "LOAD_UNKNOWN_SOURCE"
COMPILE_CONDITION_WARNING = "LOAD_COMPILE_CONDITION"  # libsinsp's compiler warnings
UNSAFE_NA_CHECK = "LOAD_UNSAFE_NA_CHECK"
NO_EVTTYPE = "LOAD_NO_EVTTYPE"
UNKNOWN_FILTER = "LOAD_UNKNOWN_FILTER"
UNUSED_MACRO = "LOAD_UNUSED_MACRO"
UNUSED_LIST = "LOAD_UNUSED_LIST"
UNKNOWN_ITEM = "LOAD_UNKNOWN_ITEM"
DEPRECATED_ITEM = "LOAD_DEPRECATED_ITEM"
APPEND_NO_VALUES = "LOAD_APPEND_NO_VALUES"
EXCEPTION_NAME_NOT_UNIQUE = "LOAD_EXCEPTION_NAME_NOT_UNIQUE"
INVALID_MACRO_NAME = "LOAD_INVALID_MACRO_NAME"
INVALID_LIST_NAME = "LOAD_INVALID_LIST_NAME"


@dataclass(frozen=True, slots=True)
class LoadWarning:
    message: str
    ctx: ItemContext | None = None
    code: str = UNKNOWN_ITEM

    def __str__(self) -> str:
        return f"{self.ctx.describe()}: {self.message}" if self.ctx else self.message


# --- model ------------------------------------------------------------------


@dataclass
class ListInfo:
    name: str
    items: list[str]
    ctx: ItemContext
    index: int = 0


@dataclass
class MacroInfo:
    name: str
    condition: str
    ctx: ItemContext
    index: int = 0
    # Falco resolves a macro's references only to macros defined before its
    # latest definition or append (the "visibility" order).
    visibility: int = 0


@dataclass
class ExceptionInfo:
    """One entry of a rule's ``exceptions``.

    ``fields``/``comps`` are a string (single-field form) or a list of strings
    (tuple form); ``values`` holds strings, or lists of strings/lists.
    """

    name: str
    fields: str | list[str] | None
    comps: str | list[str] | None
    values: list[Any]
    ctx: ItemContext


@dataclass
class RuleInfo:
    name: str
    condition: str
    output: str
    desc: str
    priority: Priority
    ctx: ItemContext
    source: str = SYSCALL_SOURCE
    tags: list[str] = field(default_factory=list)
    enabled: bool = True
    exceptions: list[ExceptionInfo] = field(default_factory=list)
    warn_evttypes: bool = True
    skip_if_unknown_filter: bool = False
    capture: bool = False
    capture_duration: int = 0  # ms; 0: Falco's configured default
    index: int = 0


@dataclass
class LoadResult:
    """Everything read from the rule files, overrides applied, in definition order."""

    files: list[str] = field(default_factory=list)
    lists: dict[str, ListInfo] = field(default_factory=dict)
    macros: dict[str, MacroInfo] = field(default_factory=dict)
    rules: dict[str, RuleInfo] = field(default_factory=dict)
    warnings: list[LoadWarning] = field(default_factory=list)
    required_engine_version: str | None = None
    required_plugin_versions: list[dict[str, Any]] = field(default_factory=list)
    _next_index: int = 0

    def next_index(self) -> int:
        self._next_index += 1
        return self._next_index

    def warn(self, message: str, ctx: ItemContext | None = None, code: str = UNKNOWN_ITEM) -> None:
        self.warnings.append(LoadWarning(message, ctx, code))


# --- engine version ---------------------------------------------------------

# The rules-engine version this engine matches (the upstream rule files of
# Falco 0.44 require 0.57.0); a file requiring a later one is refused.
ENGINE_VERSION = (0, 57, 0)


def parse_engine_version(text: str, ctx: ItemContext) -> tuple[int, int, int]:
    """``required_engine_version``: a semver, or a legacy integer N meaning 0.N.0."""
    if re.fullmatch(r"[0-9]+", text):
        return (0, int(text), 0)
    m = re.fullmatch(r"([0-9]+)\.([0-9]+)\.([0-9]+)(?:[-+][0-9A-Za-z.+-]*)?", text)
    if m is None:
        raise RuleLoadError(
            f"unable to parse engine version '{text}' as a semver string", ctx, YAML_VALIDATE
        )
    major, minor, patch = (int(g) for g in m.groups())
    return (major, minor, patch)


# --- YAML -------------------------------------------------------------------


# libyaml's parser when PyYAML has it (several times faster on the upstream files).
_BaseLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _StringLoader(_BaseLoader):  # type: ignore[valid-type,misc]
    """SafeLoader that only resolves null implicitly: every other plain scalar is a string."""


_StringLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag == "tag:yaml.org,2002:null"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _untagged(loader: yaml.SafeLoader, _suffix: str, node: yaml.Node) -> Any:
    # yaml-cpp keeps a node's value whatever its tag (``!foo bar`` reads as
    # ``bar``); PyYAML would refuse the unknown tag.
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return loader.construct_scalar(node)  # type: ignore[arg-type]


_StringLoader.add_multi_constructor("!", _untagged)
_StringLoader.add_multi_constructor("tag:yaml.org,2002:", _untagged)

_TRUE = {"true", "yes", "on", "y"}
_FALSE = {"false", "no", "off", "n"}


def _read_items(text: str, file: str) -> list[tuple[int, Any]]:
    """Every document's top-level sequence as (line, python value) pairs
    (Falco reads all the documents of a file, in order)."""
    loader = _StringLoader(text)
    items: list[tuple[int, Any]] = []
    try:
        while loader.check_node():
            root = loader.get_node()
            if root is None or _is_empty(root):
                continue
            if not isinstance(root, yaml.SequenceNode):
                raise RuleLoadError(
                    "rules content must be a YAML sequence of items",
                    ItemContext(file, root.start_mark.line + 1, "file"),
                    YAML_VALIDATE,
                )
            items += [(n.start_mark.line + 1, loader.construct_object(n, True)) for n in root.value]
        return items
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(e, "problem", None) or str(e)
        raise RuleLoadError(
            f"invalid YAML: {problem}", ItemContext(file, line, "file"), YAML_PARSE
        ) from None
    finally:
        loader.dispose()


def _is_empty(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag.endswith(":null")


# --- value decoding ---------------------------------------------------------


def _require(item: dict[str, Any], key: str, ctx: ItemContext) -> Any:
    if key not in item or item[key] is None:
        raise RuleLoadError(f"missing required key '{key}'", ctx, YAML_VALIDATE)
    return item[key]


def _as_str(value: Any, key: str, ctx: ItemContext) -> str:
    """A present key's scalar: Falco refuses a null or empty one, as it does a missing one."""
    if isinstance(value, (dict, list)):
        raise RuleLoadError(f"'{key}' must be a string", ctx, YAML_VALIDATE)
    if value is None:
        raise RuleLoadError(f"mapping for key '{key}' is empty", ctx, YAML_VALIDATE)
    text = str(value)
    if not text:
        raise RuleLoadError(f"value for key '{key}' must be non-empty", ctx, YAML_VALIDATE)
    return text


def _as_bool(value: Any, key: str, ctx: ItemContext) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise RuleLoadError(f"'{key}' must be true or false, not '{value}'", ctx, YAML_VALIDATE)


def _as_str_list(value: Any, key: str, ctx: ItemContext) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise RuleLoadError(f"'{key}' must be a sequence", ctx, YAML_VALIDATE)
    for v in value:
        if v is None or isinstance(v, (dict, list)):
            raise RuleLoadError(f"'{key}' entries must be strings", ctx, YAML_VALIDATE)
    return [str(v) for v in value]


def _as_count(value: Any, key: str, ctx: ItemContext) -> int:
    text = _as_str(value, key, ctx).strip()
    if not text.isdigit():
        raise RuleLoadError(
            f"'{key}' must be an unsigned integer, not '{text}'", ctx, YAML_VALIDATE
        )
    return int(text)


# What Falco's rule loader accepts (falco_common::parse_priority): the names and
# "info", any case; the alert aliases ("warn", "err") are not rule spellings.
_RULE_PRIORITY_SPELLINGS = frozenset({p.value.lower() for p in Priority} | {"info"})


def _priority(value: Any, ctx: ItemContext) -> Priority:
    text = _as_str(value, "priority", ctx)
    if text.strip().lower() not in _RULE_PRIORITY_SPELLINGS:
        raise RuleLoadError(f"invalid priority '{text}'", ctx, YAML_VALIDATE)
    return Priority.parse(text)


def _overrides(
    item: dict[str, Any], appendable: Sequence[str], replaceable: Sequence[str], ctx: ItemContext
) -> tuple[set[str], set[str]]:
    raw = item.get("override")
    if raw is None:
        return set(), set()
    if not isinstance(raw, dict):
        raise RuleLoadError(
            "'override' must be a mapping of key: append|replace", ctx, YAML_VALIDATE
        )
    append, replace = set(), set()
    for key, how in raw.items():
        how = str(how).strip().lower()
        if how == "append" and key in appendable:
            append.add(key)
        elif how == "replace" and key in replaceable:
            replace.add(key)
        elif how not in ("append", "replace"):
            raise RuleLoadError(
                f"override for '{key}' must be append or replace, not '{how}'", ctx, YAML_VALIDATE
            )
        else:
            raise RuleLoadError(f"key '{key}' cannot be overridden with {how}", ctx, YAML_VALIDATE)
    return append, replace


# --- exceptions ---------------------------------------------------------------


_EXCEPTION_KEYS = {"name", "fields", "comps", "values"}


def _read_exceptions(
    raw: Any, ctx: ItemContext, appending: bool, res: LoadResult
) -> list[ExceptionInfo]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise RuleLoadError("'exceptions' must be a sequence", ctx, YAML_VALIDATE)
    out: list[ExceptionInfo] = []
    for ex in raw:
        if not isinstance(ex, dict):
            raise RuleLoadError("each exception must be a mapping", ctx, YAML_VALIDATE)
        name = _as_str(_require(ex, "name", ctx), "name", ctx)
        ectx = ItemContext(ctx.file, ctx.line, ctx.kind, f"{ctx.name}' exception '{name}")
        if any(e.name == name for e in out):
            res.warn("multiple exceptions have the same name", ectx, EXCEPTION_NAME_NOT_UNIQUE)
        unknown = sorted(set(ex) - _EXCEPTION_KEYS)
        if unknown:
            res.warn(f"unknown exception keys {unknown}", ectx, UNKNOWN_ITEM)
        fields = _str_or_list(ex.get("fields"), "fields", ectx)
        comps = _str_or_list(ex.get("comps"), "comps", ectx)
        if fields is None and not appending:
            raise RuleLoadError("exception must have a 'fields' property", ectx, YAML_VALIDATE)
        values = ex.get("values")
        if values is None:
            values = []
        if not isinstance(values, list):
            raise RuleLoadError("exception 'values' must be a sequence", ectx, YAML_VALIDATE)
        out.append(ExceptionInfo(name, fields, comps, values, ectx))
    return out


def _str_or_list(value: Any, key: str, ctx: ItemContext) -> str | list[str] | None:
    if value is None:
        return None
    if isinstance(value, list):
        return _as_str_list(value, key, ctx)
    return _as_str(value, key, ctx)


def validate_exception(ex: ExceptionInfo) -> None:
    """Falco's checks on an exception's shape; fills the default comparisons."""
    from policies.falco.grammar import (
        LIST_OPS,
        NUM_OPS,
        STR_OPS,
        UNARY_OPS,
        is_modified_operator,
    )

    operators = set(NUM_OPS + STR_OPS + LIST_OPS + UNARY_OPS)
    if isinstance(ex.fields, list):
        if ex.comps is None:
            ex.comps = ["="] * len(ex.fields)
        if not isinstance(ex.comps, list) or len(ex.comps) != len(ex.fields):
            raise RuleLoadError("fields and comps lists must have equal length", ex.ctx)
        for comp in ex.comps:
            if comp not in operators and not is_modified_operator(comp):
                raise RuleLoadError(f"'{comp}' is not a supported comparison operator", ex.ctx)
        for value in ex.values:
            if not isinstance(value, list) or len(value) != len(ex.fields):
                raise RuleLoadError("fields and values lists must have equal length", ex.ctx)
    else:
        if ex.comps is None:
            ex.comps = "in"
        if isinstance(ex.comps, list):
            raise RuleLoadError("fields and comps must both be strings", ex.ctx)
        if ex.comps not in LIST_OPS and not is_modified_operator(ex.comps):
            raise RuleLoadError(
                "when fields is a single value, comps must be one of (in, pmatch, intersects)"
                " or an operator with oneof/anyof/allof",
                ex.ctx,
            )
        for value in ex.values:
            if isinstance(value, (list, dict)):
                raise RuleLoadError("expected values array to contain a list of strings", ex.ctx)


# --- the collector ------------------------------------------------------------


class _Reader:
    """Applies the items of one file to a ``LoadResult``."""

    def __init__(self, result: LoadResult, file: str) -> None:
        self.res = result
        self.file = file
        self._now = 0

    def read(self, text: str) -> None:
        for line, item in _read_items(text, self.file):
            self.read_item(line, item)

    def read_item(self, line: int, item: Any) -> None:
        self._now = self.res.next_index()  # every item advances the order, as in Falco
        ctx = ItemContext(self.file, line, "item")
        if not isinstance(item, dict):
            raise RuleLoadError(
                "each item must be a mapping (list, macro or rule)", ctx, YAML_VALIDATE
            )
        if "required_engine_version" in item:
            self._engine_version(item["required_engine_version"], ctx)
        elif "required_plugin_versions" in item:
            self._plugin_versions(item["required_plugin_versions"], ctx)
        elif "list" in item:
            self._list(item, line)
        elif "macro" in item:
            self._macro(item, line)
        elif "rule" in item:
            self._rule(item, line)
        else:
            self.res.warn(f"unknown top level item with keys {sorted(item)}", ctx)

    def _ctx(self, kind: str, item: dict[str, Any], line: int) -> ItemContext:
        name = _as_str(item.get(kind), kind, ItemContext(self.file, line, kind))
        ctx = ItemContext(self.file, line, kind, name)
        if not name:
            raise RuleLoadError(f"{kind} name must not be empty", ctx, YAML_VALIDATE)
        unknown = sorted(set(item) - _KNOWN_KEYS[kind])
        if unknown:
            self.res.warn(f"unknown keys {unknown}", ctx)
        return ctx

    def _engine_version(self, raw: Any, ctx: ItemContext) -> None:
        text = _as_str(raw, "required_engine_version", ctx).strip()
        wanted = parse_engine_version(text, ctx)
        if wanted > ENGINE_VERSION:
            have = ".".join(map(str, ENGINE_VERSION))
            raise RuleLoadError(f"rules require engine version {text}, but engine is {have}", ctx)
        self.res.required_engine_version = text

    def _plugin_versions(self, raw: Any, ctx: ItemContext) -> None:
        if not isinstance(raw, list):
            raise RuleLoadError("required_plugin_versions must be a sequence", ctx, YAML_VALIDATE)
        for entry in raw:
            if not isinstance(entry, dict) or "name" not in entry or "version" not in entry:
                raise RuleLoadError(
                    "each required plugin needs a name and a version", ctx, YAML_VALIDATE
                )
            self.res.required_plugin_versions.append(entry)

    def _legacy_append(self, item: dict[str, Any], ctx: ItemContext) -> bool:
        append = _as_bool(item.get("append", False), "append", ctx)
        if append:
            self.res.warn("'append' is deprecated; use 'override'", ctx, DEPRECATED_ITEM)
            if "override" in item:
                raise RuleLoadError(
                    "'append' and 'override' cannot be used together", ctx, YAML_VALIDATE
                )
        return append

    # lists -------------------------------------------------------------

    def _list(self, item: dict[str, Any], line: int) -> None:
        ctx = self._ctx("list", item, line)
        if not _LIST_NAME.fullmatch(ctx.name):
            self.res.warn("invalid list name", ctx, INVALID_LIST_NAME)
        items = _as_str_list(_require(item, "items", ctx), "items", ctx)
        append = self._legacy_append(item, ctx)
        ov_append, _ = _overrides(item, ("items",), ("items",), ctx)
        if append or "items" in ov_append:
            prev = self.res.lists.get(ctx.name)
            if prev is None:
                raise RuleLoadError("list appended to, but no earlier definition exists", ctx)
            prev.items.extend(items)
            return
        self._define(self.res.lists, ListInfo(ctx.name, items, ctx))

    # macros ------------------------------------------------------------

    def _macro(self, item: dict[str, Any], line: int) -> None:
        ctx = self._ctx("macro", item, line)
        if not _MACRO_NAME.fullmatch(ctx.name):
            self.res.warn("invalid macro name: use letters, digits and _", ctx, INVALID_MACRO_NAME)
        cond = _as_str(_require(item, "condition", ctx), "condition", ctx)
        append = self._legacy_append(item, ctx)
        ov_append, _ = _overrides(item, ("condition",), ("condition",), ctx)
        if append or "condition" in ov_append:
            prev = self.res.macros.get(ctx.name)
            if prev is None:
                raise RuleLoadError("macro appended to, but no earlier definition exists", ctx)
            prev.condition = f"{prev.condition} {cond}"
            prev.visibility = self._now
            return
        self._define(self.res.macros, MacroInfo(ctx.name, cond, ctx, visibility=self._now))

    def _define(self, table: dict[str, Any], info: Any) -> None:
        # A redefinition replaces the item but keeps its place in the order.
        prev = table.get(info.name)
        info.index = prev.index if prev is not None else self._now
        table[info.name] = info

    # rules -------------------------------------------------------------

    def _rule(self, item: dict[str, Any], line: int) -> None:
        ctx = self._ctx("rule", item, line)
        append = self._legacy_append(item, ctx)
        ov_append, ov_replace = _overrides(item, _RULE_APPENDABLE, _RULE_REPLACEABLE, ctx)
        if ov_append or ov_replace:
            self._rule_override(item, ctx, ov_append, ov_replace)
        elif append:
            self._rule_legacy_append(item, ctx)
        elif not any(k in item for k in ("condition", "output", "desc", "priority")):
            self._rule_enable(item, ctx)
        else:
            self._rule_define(item, ctx)

    def _previous_rule(self, ctx: ItemContext, how: str) -> RuleInfo:
        prev = self.res.rules.get(ctx.name)
        if prev is None:
            raise RuleLoadError(f"rule {how}, but no earlier definition exists", ctx)
        return prev

    def _rule_define(self, item: dict[str, Any], ctx: ItemContext) -> None:
        rule = RuleInfo(
            name=ctx.name,
            condition=_as_str(_require(item, "condition", ctx), "condition", ctx),
            output=_as_str(_require(item, "output", ctx), "output", ctx).strip(),
            desc=_as_str(_require(item, "desc", ctx), "desc", ctx),
            priority=_priority(_require(item, "priority", ctx), ctx),
            ctx=ctx,
            source=_as_str(item.get("source") or SYSCALL_SOURCE, "source", ctx),
            tags=_as_str_list(item.get("tags"), "tags", ctx),
            enabled=_as_bool(item.get("enabled", True), "enabled", ctx),
            exceptions=_read_exceptions(item.get("exceptions"), ctx, False, self.res),
            warn_evttypes=_as_bool(item.get("warn_evttypes", True), "warn_evttypes", ctx),
            skip_if_unknown_filter=_as_bool(
                item.get("skip-if-unknown-filter", False), "skip-if-unknown-filter", ctx
            ),
            capture=_as_bool(item.get("capture", False), "capture", ctx),
            capture_duration=_as_count(item.get("capture_duration", 0), "capture_duration", ctx),
        )
        prev = self.res.rules.get(ctx.name)
        if prev is not None and prev.source != rule.source:
            raise RuleLoadError("rule has been re-defined with a different source", ctx)
        if rule.source != SYSCALL_SOURCE:
            self.res.warn(f"unknown source {rule.source}, skipping", ctx, UNKNOWN_SOURCE)
        for ex in rule.exceptions:
            validate_exception(ex)
        self._define(self.res.rules, rule)

    def _rule_enable(self, item: dict[str, Any], ctx: ItemContext) -> None:
        prev = self.res.rules.get(ctx.name)
        if prev is None:
            raise RuleLoadError(
                "rule has only 'enabled' (or nothing) but no earlier rule has that name", ctx
            )
        prev.enabled = _as_bool(_require(item, "enabled", ctx), "enabled", ctx)
        self.res.warn("toggling 'enabled' without 'override' is deprecated", ctx, DEPRECATED_ITEM)

    def _rule_legacy_append(self, item: dict[str, Any], ctx: ItemContext) -> None:
        prev = self._previous_rule(ctx, "appended to")
        if "condition" not in item and "exceptions" not in item:
            raise RuleLoadError(
                "appended rule must have exceptions or condition property", ctx, YAML_VALIDATE
            )
        if item.get("condition"):
            prev.condition = f"{prev.condition} {_as_str(item['condition'], 'condition', ctx)}"
        self._append_exceptions(prev, _read_exceptions(item.get("exceptions"), ctx, True, self.res))

    def _append_exceptions(self, prev: RuleInfo, new: list[ExceptionInfo]) -> None:
        for ex in new:
            if not ex.values:
                msg = "overriding/appending exception with no values"
                self.res.warn(msg, ex.ctx, APPEND_NO_VALUES)
            old = next((e for e in prev.exceptions if e.name == ex.name), None)
            if old is None:
                if ex.fields is None:
                    raise RuleLoadError("exception must have a 'fields' property", ex.ctx)
                validate_exception(ex)
                prev.exceptions.append(ex)
                continue
            if ex.fields is not None or ex.comps is not None:
                raise RuleLoadError(
                    "can not append exception fields or comps to an existing exception, "
                    "only values",
                    ex.ctx,
                )
            old.values.extend(ex.values)
            validate_exception(old)

    def _rule_override(
        self, item: dict[str, Any], ctx: ItemContext, append: set[str], replace: set[str]
    ) -> None:
        for key in append | replace:
            if key not in item:
                how = "append" if key in append else "replace"
                raise RuleLoadError(
                    f"an {how} override for '{key}' was specified but '{key}' is not defined",
                    ctx,
                    YAML_VALIDATE,
                )
        for key in set(_RULE_APPENDABLE) | set(_RULE_REPLACEABLE):
            if key in item and key not in append and key not in replace:
                raise RuleLoadError(
                    f"unexpected key '{key}': no corresponding entry under 'override'",
                    ctx,
                    YAML_VALIDATE,
                )
        if append:
            self._apply_append(self._previous_rule(ctx, "appended to"), item, append, ctx)
        if replace:
            self._apply_replace(self._previous_rule(ctx, "replaced"), item, replace, ctx)

    def _apply_append(
        self, prev: RuleInfo, item: dict[str, Any], keys: set[str], ctx: ItemContext
    ) -> None:
        for key, attr in (("condition", "condition"), ("output", "output"), ("desc", "desc")):
            if key in keys:
                extra = _as_str(item[key], key, ctx)
                if extra:
                    setattr(prev, attr, f"{getattr(prev, attr)} {extra}")
        if "tags" in keys:
            for tag in _as_str_list(item["tags"], "tags", ctx):
                if tag not in prev.tags:
                    prev.tags.append(tag)
        if "exceptions" in keys:
            self._append_exceptions(prev, _read_exceptions(item["exceptions"], ctx, True, self.res))

    def _apply_replace(
        self, prev: RuleInfo, item: dict[str, Any], keys: set[str], ctx: ItemContext
    ) -> None:
        if "condition" in keys:
            prev.condition = _as_str(item["condition"], "condition", ctx)
        if "output" in keys:
            prev.output = _as_str(item["output"], "output", ctx).strip()
        if "desc" in keys:
            prev.desc = _as_str(item["desc"], "desc", ctx)
        if "tags" in keys:
            prev.tags = _as_str_list(item["tags"], "tags", ctx)
        if "priority" in keys:
            prev.priority = _priority(item["priority"], ctx)
        if "enabled" in keys:
            prev.enabled = _as_bool(item["enabled"], "enabled", ctx)
        if "warn_evttypes" in keys:
            prev.warn_evttypes = _as_bool(item["warn_evttypes"], "warn_evttypes", ctx)
        if "skip-if-unknown-filter" in keys:
            prev.skip_if_unknown_filter = _as_bool(
                item["skip-if-unknown-filter"], "skip-if-unknown-filter", ctx
            )
        if "capture" in keys:
            prev.capture = _as_bool(item["capture"], "capture", ctx)
        if "capture_duration" in keys:
            prev.capture_duration = _as_count(item["capture_duration"], "capture_duration", ctx)
        if "exceptions" in keys:
            exceptions = _read_exceptions(item["exceptions"], ctx, False, self.res)
            for ex in exceptions:
                validate_exception(ex)
            prev.exceptions = exceptions


# --- entry points -------------------------------------------------------------


def load_texts(sources: Iterable[tuple[str, str]], into: LoadResult | None = None) -> LoadResult:
    """Load (name, YAML text) pairs in order; later ones override earlier ones."""
    result = into if into is not None else LoadResult()
    for name, text in sources:
        result.files.append(name)
        _Reader(result, name).read(text)
    return result


def load_files(paths: Iterable[Path | str], into: LoadResult | None = None) -> LoadResult:
    """Load Falco rule files in order (like repeated ``falco -r``)."""
    sources: list[tuple[str, str]] = []
    for p in paths:
        path = Path(p)
        try:
            sources.append((str(path), path.read_text(encoding="utf-8")))
        except OSError as e:
            raise RuleLoadError(
                f"cannot read file: {e.strerror or e}", ItemContext(str(path), None, "file")
            ) from None
        except UnicodeDecodeError:
            raise RuleLoadError(
                "file is not UTF-8 text", ItemContext(str(path), None, "file")
            ) from None
    return load_texts(sources, into)
