"""Falco's condition language: a parser and the AST it produces.

The parser follows libsinsp's filter parser (the reference implementation)
rule for rule, as a hand-written recursive descent over the text: field
names need at least one dot, macro names are plain identifiers, bare string
values are any run of characters other than blanks, quotes, parentheses,
``=`` and ``,``, numeric operators take numbers, word operators
(``contains``, ``startswith`` ...) and ``and``/``or`` need a blank (or a
parenthesis) after them, transformers are a name glued to ``(``, and the
arguments of ``join``/``concat``/``getopt`` may be fields, transformers,
quoted strings, numbers and parenthesised lists of those. What the lexer
reads at a point depends on what the parser expects there, as in libsinsp.

This module knows nothing about lists, macros or fields: it turns text into
an AST; ``compiler.py`` expands and compiles it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

# Operators grouped as libsinsp groups them: what follows each group differs.
NUM_OPS = ("<=", "<", ">=", ">")
STR_OPS = (
    "==",
    "=",
    "!=",
    "glob",
    "iglob",
    "contains",
    "icontains",
    "bcontains",
    "startswith",
    "bstartswith",
    "endswith",
    "regex",
)
LIST_OPS = ("in", "intersects", "pmatch")
UNARY_OPS = ("exists",)
# Falco 0.44: ``<string operator> oneof|anyof|allof (v1, v2, ...)``.
MODIFIERS = ("oneof", "anyof", "allof")


def is_modified_operator(text: str) -> bool:
    """``startswith anyof`` and the like (what exception ``comps`` may hold too)."""
    parts = text.split()
    return len(parts) == 2 and parts[0] in STR_OPS and parts[1] in MODIFIERS


TRANSFORMERS = ("tolower", "toupper", "b64", "basename", "len")
# Falco 0.44's transformers over several arguments (see calls.py).
CALLS = ("join", "concat", "getopt")

_QUOTED = r""""(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'"""

# --- AST ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FieldRef:
    """A field as written: name, optional ``[arg]`` and transformers (outermost first).

    With ``args`` it is a transformer call whose arguments are not one plain
    field (``join("-", (a.b, c.d))``, ``concat(a.b, "x")``, ``toupper("x")``,
    ``toupper(a.b)[x]``): ``name`` is the transformer, ``arg`` its ``[arg]``.
    """

    name: str
    arg: str | None = None
    transformers: tuple[str, ...] = ()
    args: tuple[CallArg, ...] | None = None

    def text(self) -> str:
        name = self.name
        if self.args is not None:
            name += "(" + ", ".join(_arg_text(a) for a in self.args) + ")"
        inner = name if self.arg is None else f"{name}[{_field_arg_text(self.arg)}]"
        for t in reversed(self.transformers):
            inner = f"{t}({inner})"
        return inner


@dataclass(frozen=True, slots=True)
class Value:
    """A right-hand value. ``quoted`` matters: a quoted word is never a list name."""

    text: str
    quoted: bool = False


@dataclass(frozen=True, slots=True)
class ArgList:
    """A parenthesised list inside a transformer call: ``(fd.name, "x", 1)``."""

    items: tuple[FieldRef | Value, ...]


CallArg = FieldRef | Value | ArgList


def _arg_text(arg: CallArg) -> str:
    if isinstance(arg, ArgList):
        return "(" + ", ".join(_arg_text(a) for a in arg.items) + ")"
    if isinstance(arg, FieldRef):
        return arg.text()
    return (
        arg.text
        if _NUMBER.fullmatch(arg.text) and not arg.quoted
        else quote_value(arg.text, force=True)
    )


def _field_arg_text(arg: str) -> str:
    return arg if _FIELD_ARG_BARE.fullmatch(arg) else quote_value(arg, force=True)


@dataclass(frozen=True, slots=True)
class ListValue:
    items: tuple[Value, ...]


@dataclass(frozen=True, slots=True)
class FieldValue:
    """``val(field)`` or a transformer on the right: field-to-field comparison.

    ``val_arg`` is an ``[arg]`` written after ``val(...)``, which libsinsp
    parses and its compiler refuses.
    """

    field: FieldRef
    is_val: bool = True
    val_arg: str | None = None


Rhs = Value | ListValue | FieldValue


@dataclass(frozen=True, slots=True)
class UnaryCheck:
    field: FieldRef
    op: str


@dataclass(frozen=True, slots=True)
class BinaryCheck:
    field: FieldRef
    op: str
    value: Rhs
    modifier: str | None = None  # oneof/anyof/allof: ``op`` against each item of a list


@dataclass(frozen=True, slots=True)
class MacroRef:
    name: str


@dataclass(frozen=True, slots=True)
class Not:
    child: Node


@dataclass(frozen=True, slots=True)
class And:
    children: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Or:
    children: tuple[Node, ...]


Node = And | Or | Not | UnaryCheck | BinaryCheck | MacroRef


class ConditionParseError(ValueError):
    """The text is not a valid condition; ``column`` is 1-based when known."""

    def __init__(self, message: str, column: int | None = None) -> None:
        super().__init__(message)
        self.column = column


# --- string escapes ---------------------------------------------------------

# libsinsp's unescape: the usual C escapes, \xHH, and the quote that delimits the string.
_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "\\": "\\", "/": "/"}
_HEX2 = re.compile(r"[0-9a-fA-F]{2}")


def unquote(text: str) -> str:
    """Strip the quotes from a quoted token and resolve escapes as Falco does.

    The result holds bytes as UTF-8 text: ``\\xHH`` escapes are bytes, and
    bytes that are not UTF-8 become surrogate escapes (as event buffers do)."""
    delim, body = text[0], text[1:-1]
    out = bytearray()
    i = 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out += c.encode("utf-8", "surrogateescape")
            i += 1
            continue
        i += 1
        if i >= len(body):
            raise ConditionParseError(f"dangling escape in string {text}")
        e = body[i]
        if e in _ESCAPES:
            out += _ESCAPES[e].encode()
        elif e == " ":
            out += b"\\"  # libsinsp keeps a lone backslash for "\ " (legacy rules)
        elif e in "\"'":
            if e != delim:
                raise ConditionParseError(f"invalid \\{e} escape in {delim}-quoted string")
            out += e.encode()
        elif e == "x":
            digits = body[i + 1 : i + 3]
            if len(digits) < 2:
                raise ConditionParseError("truncated hex char escape sequence")
            if not _HEX2.fullmatch(digits):
                raise ConditionParseError(f"invalid hex char escape sequence: {digits}")
            out.append(int(digits, 16))
            i += 2
        else:
            raise ConditionParseError(f"unsupported string escape sequence: \\{e}")
        i += 1
    return out.decode("utf-8", "surrogateescape")


def is_quoted(text: str) -> bool:
    """True when the whole of ``text`` is one quoted string token."""
    return bool(text) and text[0] in "\"'" and re.fullmatch(_QUOTED, text, re.S) is not None


_BARE_SAFE = re.compile(r"""[^()"'\s=,]+""")


def quote_value(text: str, force: bool = False) -> str:
    """Render a value so that the parser reads it back unchanged."""
    if not force and _BARE_SAFE.fullmatch(text) and text not in ("and", "or", "not"):
        return text
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    escaped = escaped.replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")
    if escaped.endswith("\\"):  # libsinsp's lexer reads \" as an escaped quote
        escaped = escaped[:-2] + "\\x5c"
    return f'"{escaped}"'


# --- the parser ---------------------------------------------------------------

# libsinsp's lexical classes ([:space:] is POSIX: blank, \t, \n, \v, \f, \r).
_SPACE = " \t\n\v\f\r"
_BLANKS = " \t\b\r\n"  # what the parser skips between tokens
_IDENT = re.compile(r"[a-zA-Z]+[a-zA-Z0-9_]*")
_FIELD = re.compile(r"[a-zA-Z]+[a-zA-Z0-9_]*(?:\.[a-zA-Z]+[a-zA-Z0-9_]*)+")
_FIELD_ARG_BARE = re.compile(rf"[^\]\[\"'{_SPACE}]+")
_HEX = re.compile(r"0[xX][0-9a-fA-F]+")
_NUMBER = re.compile(r"[+\-]?[0-9]+\.?[0-9]*(?:[eE][+\-][0-9]+)?")
_BARE = re.compile(rf"[^()\"'{_SPACE}=,]+")
_NOT_BLANK = re.compile(rf"not[{_SPACE}]+")

# Word operators need a blank after them (the blank is part of the token).
_WORD_STR_OPS = tuple(op for op in STR_OPS if op.isalpha())
_MAX_DEPTH = 100  # libsinsp's recursion limit
# Tried in this order, so that "intersects" is not read as "in" + "tersects".
_LIST_OPS_LEXED = ("intersects", "in", "pmatch")


class _Parser:
    """One parse of one condition; ``pos`` is the index into ``text``."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.depth = 0

    # -- lexing helpers ------------------------------------------------------

    def error(self, message: str) -> ConditionParseError:
        line_start = self.text.rfind("\n", 0, self.pos) + 1
        column = self.pos - line_start + 1
        near = self.text[self.pos : self.pos + 20]
        where = f"at column {column}" + (f" near {near!r}" if near else " at the end")
        return ConditionParseError(f"{message} ({where})", column)

    def blank(self) -> bool:
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] in _BLANKS:
            self.pos += 1
        return self.pos > start

    def word(self, word: str) -> bool:
        if self.text.startswith(word, self.pos):
            self.pos += len(word)
            return True
        return False

    def regex(self, rx: re.Pattern[str]) -> str | None:
        m = rx.match(self.text, self.pos)
        if m is None:
            return None
        self.pos = m.end()
        return m.group(0)

    def operator(self, ops: tuple[str, ...], blank_after: Callable[[str], bool]) -> str | None:
        for op in ops:
            start = self.pos
            if self.word(op):
                if not blank_after(op) or self.blank():
                    return op
                self.pos = start
        return None

    def quoted(self) -> str | None:
        """A quoted string: it ends at the first delimiter not preceded by a
        backslash (libsinsp's scan), then escapes are resolved."""
        if self.pos >= len(self.text) or self.text[self.pos] not in "\"'":
            return None
        delim, start = self.text[self.pos], self.pos
        i = start + 1
        while i < len(self.text):
            if self.text[i] == delim and self.text[i - 1] != "\\":
                token = self.text[start : i + 1]
                try:
                    value = unquote(token)
                except ConditionParseError as e:
                    raise self.error(str(e)) from None
                self.pos = i + 1
                return value
            i += 1
        return None

    def number(self) -> str | None:
        return self.regex(_HEX) or self.regex(_NUMBER)

    def enter(self) -> None:
        self.depth += 1
        if self.depth >= _MAX_DEPTH:
            raise self.error(f"exceeded max depth limit of {_MAX_DEPTH}")

    # -- grammar ---------------------------------------------------------------

    def parse(self) -> Node:
        if not self.text:
            raise self.error("condition is empty")
        node = self.or_expr()
        if self.pos != len(self.text):
            raise self.error("unexpected text, expecting 'or', 'and'")
        return node

    def _bool_expr(self, keyword: str, child: Callable[[], Node]) -> list[Node]:
        self.enter()
        self.blank()
        children = [child()]
        self.blank()
        while self.word(keyword):
            if self.blank():
                children.append(child())
            elif self.word("("):
                children.append(self.embedded())
            else:
                raise self.error(f"expected a blank or '(' after '{keyword}'")
            self.blank()
        self.depth -= 1
        return children

    def or_expr(self) -> Node:
        children = self._bool_expr("or", self.and_expr)
        return children[0] if len(children) == 1 else Or(tuple(children))

    def and_expr(self) -> Node:
        children = self._bool_expr("and", self.not_expr)
        return children[0] if len(children) == 1 else And(tuple(children))

    def not_expr(self) -> Node:
        self.enter()
        self.blank()
        negate = False
        while self.regex(_NOT_BLANK):
            negate = not negate
        if self.word("not("):
            negate = not negate
            child = self.embedded()
        else:
            child = self.check()
        self.depth -= 1
        return Not(child) if negate else child

    def embedded(self) -> Node:
        """The rest of a parenthesised expression, after its '('."""
        self.enter()
        self.blank()
        node = self.or_expr()
        self.blank()
        if not self.word(")"):
            raise self.error("expected a ')' token")
        self.depth -= 1
        return node

    def check(self) -> Node:
        self.enter()
        self.blank()
        if self.word("("):
            node = self.embedded()
        elif (name := self.regex(_FIELD)) is not None:
            node = self.condition(FieldRef(name, self.field_arg()))
        elif (tr := self.transformer_name()) is not None:
            self.blank()
            node = self.condition(self.transformer(tr))
        elif (ident := self.regex(_IDENT)) is not None:
            node = MacroRef(ident)
        else:
            raise self.error("expected a '(' token, a field check, or an identifier")
        self.depth -= 1
        return node

    def transformer_name(self) -> str | None:
        for name in TRANSFORMERS + CALLS:
            if self.word(name + "("):
                return name
        return None

    def field_arg(self) -> str | None:
        if not self.word("["):
            return None
        arg = self.quoted()
        if arg is None:
            arg = self.regex(_FIELD_ARG_BARE)
        if arg is None:
            raise self.error("expected a valid field argument: a quoted string or a bare string")
        if not self.word("]"):
            raise self.error("expected a ']' token")
        return arg

    def transformer(self, name: str) -> FieldRef:
        """The rest of ``name(`` ...: its arguments, ')' and an optional [arg]."""
        self.enter()
        self.blank()
        args = [self.transformer_arg()]
        self.blank()
        while self.word(","):
            args.append(self.transformer_arg())
            self.blank()
        self.blank()
        if not self.word(")"):
            raise self.error("expected a ')' token closing the transformer")
        arg = self.field_arg()
        self.depth -= 1
        return _transformed(name, args, arg)

    def transformer_arg(self) -> CallArg:
        self.blank()
        if (num := self.number()) is not None:
            return Value(num)
        if (text := self.quoted()) is not None:
            return Value(text, quoted=True)
        if self.word("("):
            return self.arg_list()
        if (tr := self.transformer_name()) is not None:
            return self.transformer(tr)
        if (name := self.regex(_FIELD)) is not None:
            return FieldRef(name, self.field_arg())
        raise self.error(
            "expected a transformer argument: field, transformer, quoted string, number or list"
        )

    def arg_list(self) -> ArgList:
        """A list argument of a transformer, after its '(': no bare strings, no nesting."""
        self.blank()
        if self.word(")"):
            return ArgList(())
        items = [self.arg_list_item()]
        self.blank()
        while self.word(","):
            self.blank()
            items.append(self.arg_list_item())
            self.blank()
        if not self.word(")"):
            raise self.error("expected ')'")
        return ArgList(tuple(items))

    def arg_list_item(self) -> FieldRef | Value:
        if (name := self.regex(_FIELD)) is not None:
            return FieldRef(name, self.field_arg())
        if (tr := self.transformer_name()) is not None:
            self.blank()
            return self.transformer(tr)
        if (text := self.quoted()) is not None:
            return Value(text, quoted=True)
        if (num := self.number()) is not None:
            return Value(num)
        raise self.error("expected a list argument: field, transformer, quoted string or number")

    def condition(self, lhs: FieldRef) -> Node:
        self.enter()
        self.blank()
        if self.word("exists"):
            self.depth -= 1
            return UnaryCheck(lhs, "exists")
        self.blank()
        node: Node
        if (op := self.operator(NUM_OPS, lambda _op: False)) is not None:
            node = BinaryCheck(lhs, op, self.num_value())
        elif (op := self.operator(STR_OPS, lambda op: op.isalpha())) is not None:
            node = self.str_check(lhs, op)
        elif (op := self.operator(_LIST_OPS_LEXED, lambda _op: False)) is not None:
            node = BinaryCheck(lhs, op, self.list_or_field())
        else:
            raise self.error("expected a check operator: " + ", ".join(_ALL_OPS))
        self.depth -= 1
        return node

    def str_check(self, lhs: FieldRef, op: str) -> Node:
        # A modifier needs a blank before it (word operators ate theirs) and after
        # it, then a list or a list name that is not and/or/not; else it is a value.
        had_blank = op.isalpha() or self.blank()
        saved = self.pos
        if had_blank:
            modifier = self.operator(MODIFIERS, lambda _op: True)
            if modifier is not None and self.list_follows() and not self.bool_word_follows():
                return BinaryCheck(lhs, op, self.list_value(), modifier)
        self.pos = saved
        return BinaryCheck(lhs, op, self.str_value())

    def list_follows(self) -> bool:
        return self.text.startswith("(", self.pos) or _IDENT.match(self.text, self.pos) is not None

    def bool_word_follows(self) -> bool:
        for word in ("and", "or", "not"):
            end = self.pos + len(word)
            if self.text.startswith(word, self.pos) and (
                end == len(self.text) or not self.text[end].isalnum()
            ):
                return True
        return False

    def field_value(self) -> FieldValue | None:
        """``val(field)`` or a transformer on the right, if one is there."""
        self.blank()
        if self.word("val("):
            self.blank()
            name = self.regex(_FIELD)
            if name is None:
                raise self.error("expected a field within 'val' transformer")
            inner = FieldRef(name, self.field_arg())
            self.blank()
            if not self.word(")"):
                raise self.error("expected a ')' token closing the transformer")
            return FieldValue(inner, True, self.field_arg())
        if (tr := self.transformer_name()) is not None:
            self.blank()
            return FieldValue(self.transformer(tr), False)
        return None

    def num_value(self) -> Rhs:
        self.enter()
        self.blank()
        rhs: Rhs | None = self.field_value()
        if rhs is None and (num := self.number()) is not None:
            rhs = Value(num)
        if rhs is None:
            raise self.error("expected a number value or a field with a valid transformer")
        self.depth -= 1
        return rhs

    def str_value(self) -> Rhs:
        self.enter()
        self.blank()
        rhs: Rhs | None = self.field_value() or self.plain_value()
        if rhs is None:
            raise self.error("expected a string value or a field with a valid transformer")
        self.depth -= 1
        return rhs

    def plain_value(self) -> Value | None:
        if (text := self.quoted()) is not None:
            return Value(text, quoted=True)
        if (bare := self.regex(_BARE)) is not None:
            return Value(bare)
        return None

    def list_items(self) -> ListValue | None:
        if not self.word("("):
            return None
        self.blank()
        items: list[Value] = []
        first = self.plain_value()
        if first is not None:
            items.append(first)
            self.blank()
            while self.word(","):
                self.blank()
                item = self.plain_value()
                if item is None:
                    raise self.error("expected a string value")
                items.append(item)
                self.blank()
        if not self.word(")"):
            raise self.error("expected a ')' token")
        return ListValue(tuple(items))

    def list_value(self) -> Rhs:
        self.enter()
        self.blank()
        rhs: Rhs | None = self.list_items()
        if rhs is None and (ident := self.regex(_IDENT)) is not None:
            rhs = Value(ident)
        if rhs is None:
            raise self.error("expected a list or an identifier")
        self.depth -= 1
        return rhs

    def list_or_field(self) -> Rhs:
        self.enter()
        self.blank()
        rhs: Rhs | None = self.list_items() or self.field_value()
        if rhs is None and (ident := self.regex(_IDENT)) is not None:
            rhs = Value(ident)
        if rhs is None:
            raise self.error("expected a list, an identifier, or a field with a valid transformer")
        self.depth -= 1
        return rhs


_ALL_OPS = ("exists", *NUM_OPS, *STR_OPS, *LIST_OPS)


def _transformed(name: str, args: list[CallArg], arg: str | None) -> FieldRef:
    """``name(args)[arg]`` as a FieldRef: a transformer over one field (or call)
    joins its chain; anything else is a call (the compiler checks it)."""
    if name in TRANSFORMERS and arg is None and len(args) == 1 and isinstance(args[0], FieldRef):
        inner = args[0]
        return FieldRef(inner.name, inner.arg, (name, *inner.transformers), inner.args)
    return FieldRef(name, arg, (), tuple(args))


def parse_condition(text: str) -> Node:
    """Parse a Falco condition into an AST; raise ``ConditionParseError``."""
    return _Parser(text).parse()


def field_ref(text: str) -> FieldRef:
    """A field as written on its own (an exception's ``fields`` entry, say)."""
    node = parse_condition(f"{text} exists")
    if not isinstance(node, UnaryCheck):
        raise ConditionParseError(f"'{text}' is not a field")
    return node.field


# --- AST -> text ------------------------------------------------------------


def _rhs_text(rhs: Rhs) -> str:
    if isinstance(rhs, ListValue):
        return "(" + ", ".join(_value_text(v) for v in rhs.items) + ")"
    if isinstance(rhs, FieldValue):
        if not rhs.is_val:
            return rhs.field.text()
        tail = "" if rhs.val_arg is None else f"[{_field_arg_text(rhs.val_arg)}]"
        return f"val({rhs.field.text()}){tail}"
    return _value_text(rhs)


def _value_text(v: Value) -> str:
    return quote_value(v.text, force=v.quoted)


def to_text(node: Node, *, _top: bool = True) -> str:
    """Render an AST back to condition text (fully parenthesised where it matters)."""
    if isinstance(node, UnaryCheck):
        return f"{node.field.text()} {node.op}"
    if isinstance(node, BinaryCheck):
        op = f"{node.op} {node.modifier}" if node.modifier else node.op
        rhs = node.value
        if (node.modifier or node.op in LIST_OPS) and isinstance(rhs, Value) and not rhs.quoted:
            return f"{node.field.text()} {op} {rhs.text}"  # a list name, as written
        return f"{node.field.text()} {op} {_rhs_text(rhs)}"
    if isinstance(node, MacroRef):
        return node.name
    if isinstance(node, Not):
        return "not " + to_text(node.child, _top=False)
    joiner = " and " if isinstance(node, And) else " or "
    body = joiner.join(to_text(c, _top=False) for c in node.children)
    return body if _top else f"({body})"
