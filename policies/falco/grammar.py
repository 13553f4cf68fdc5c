"""Falco's condition language: a lark grammar and the AST it produces.

The lexical rules follow libsinsp's filter parser (the reference
implementation): field names need at least one dot, macro names are plain
identifiers, bare string values are any run of characters other than
blanks, quotes, parentheses, ``=`` and ``,``, and numeric operators take
numbers. The parser is LALR with lark's contextual lexer, so the same text
(``and``, ``in``, ``runc:[0:PARENT]``) is lexed by what the grammar expects
at that point, which is how Falco's hand-written lexer behaves too.

This module knows nothing about lists, macros or fields: it turns text into
an AST; ``compiler.py`` expands and compiles it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedInput

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
# Falco 0.44's transformers over several arguments (fields or quoted strings).
CALLS = ("join", "concat", "getopt")

_QUOTED = r""""(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'"""
_FIELD_NAME = r"[a-zA-Z]+[a-zA-Z0-9_]*(?:\.[a-zA-Z]+[a-zA-Z0-9_]*)+"
_FIELD_ARG = r"\[(?:" + _QUOTED + r"""|[^\]\["'\s]+)\]"""

_GRAMMAR = r"""
start: _or

_or: or_expr | _and
or_expr: _and (_OR _and)+
_and: and_expr | _not
and_expr: _not (_AND _not)+
_not: not_expr | _atom
not_expr: _NOT _not
_atom: "(" _or ")"
     | check
     | macro_ref
macro_ref: IDENT

check: lhs UNARY_OP          -> unary_check
     | lhs NUM_OP num_rhs    -> binary_check
     | lhs STR_OP str_rhs    -> binary_check
     | lhs LIST_OP list_rhs  -> binary_check
     | lhs STR_OP MODIFIER "(" [list_item ("," list_item)*] ")" -> modified_check

lhs: FIELD                   -> field
   | TRANSFORMER lhs ")"     -> transformed
   | CALL call_arg ("," call_arg)* ")" [SELECTOR] -> call
?call_arg: lhs
         | QSTRING -> quoted_value

num_rhs: NUMBER -> bare_value
       | field_rhs
str_rhs: QSTRING -> quoted_value
       | BARESTR -> bare_value
       | field_rhs
list_rhs: "(" [list_item ("," list_item)*] ")" -> list_value
        | IDENT -> bare_value
        | field_rhs
?list_item: QSTRING -> quoted_value
          | BARESTR -> bare_value
field_rhs: VAL lhs ")"       -> val_rhs
         | TRANSFORMER lhs ")" -> transformed_rhs

// Word keywords end at a non-identifier character, as in libsinsp ("a andb"
// and "startswithvalue" are errors there); "exists" is the exception.
_OR.2: /or(?![A-Za-z0-9_])/
_AND.2: /and(?![A-Za-z0-9_])/
_NOT.2: /not(?![A-Za-z0-9_])/
UNARY_OP: "exists"
NUM_OP: "<=" | "<" | ">=" | ">"
STR_OP: /==|=|!=|WORD_STR_OPS_RE/
LIST_OP: /(?:intersects|in|pmatch)(?![A-Za-z0-9_])/
MODIFIER.3: /(oneof|anyof|allof)(?=[\s(])/

TRANSFORMER.4: /(tolower|toupper|b64|basename|len)\(/
CALL.4: /(join|concat|getopt)\(/
SELECTOR: /\[[^\]\s]*\]/
VAL.4: /val\(/
FIELD.3: /FIELD_RE/
IDENT: /[a-zA-Z]+[a-zA-Z0-9_]*/
NUMBER.2: /0[xX][0-9a-fA-F]+|[+\-]?[0-9]+\.?[0-9]*(?:[eE][+\-]?[0-9]+)?/
QSTRING.2: /QUOTED_RE/s
BARESTR.1: /[^()"'\s=,]+/

%ignore /[ \t\r\n\b]+/
"""


# --- AST ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FieldRef:
    """A field as written: name, optional ``[arg]`` and transformers (outermost first)."""

    name: str
    arg: str | None = None
    transformers: tuple[str, ...] = ()
    # join/concat/getopt: ``name`` is the function, ``arg`` its [selector].
    args: tuple[FieldRef | Value, ...] | None = None

    def text(self) -> str:
        name = self.name
        if self.args is not None:
            name += "(" + ", ".join(_arg_text(a) for a in self.args) + ")"
        inner = name if self.arg is None else f"{name}[{self.arg}]"
        for t in reversed(self.transformers):
            inner = f"{t}({inner})"
        return inner


@dataclass(frozen=True, slots=True)
class Value:
    """A right-hand value. ``quoted`` matters: a quoted word is never a list name."""

    text: str
    quoted: bool = False


def _arg_text(arg: FieldRef | Value) -> str:
    return arg.text() if isinstance(arg, FieldRef) else quote_value(arg.text, force=True)


@dataclass(frozen=True, slots=True)
class ListValue:
    items: tuple[Value, ...]


@dataclass(frozen=True, slots=True)
class FieldValue:
    """``val(field)`` or a transformed field on the right: field-to-field comparison."""

    field: FieldRef


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

# libsinsp's unescape: the usual C escapes, plus the quote that delimits the string.
_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "\\": "\\", "/": "/"}


def unquote(text: str) -> str:
    """Strip the quotes from a quoted token and resolve escapes as Falco does."""
    delim, body = text[0], text[1:-1]
    out: list[str] = []
    i = 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        i += 1
        if i >= len(body):
            raise ConditionParseError(f"dangling escape in string {text}")
        e = body[i]
        if e in _ESCAPES:
            out.append(_ESCAPES[e])
        elif e == " ":
            out.append("\\")  # libsinsp keeps a lone backslash for "\ " (legacy rules)
        elif e in "\"'":
            if e != delim:
                raise ConditionParseError(f"invalid \\{e} escape in {delim}-quoted string")
            out.append(e)
        else:
            raise ConditionParseError(f"unsupported string escape sequence: \\{e}")
        i += 1
    return "".join(out)


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
    return f'"{escaped}"'


# --- parse tree -> AST ------------------------------------------------------


def _split_field(token: str) -> FieldRef:
    if token.endswith("]") and "[" in token:
        name, _, arg = token.partition("[")
        arg = arg[:-1]
        return FieldRef(name, unquote(arg) if is_quoted(arg) else arg)
    return FieldRef(token)


@v_args(inline=True)
class _ToAst(Transformer):  # type: ignore[type-arg]
    def start(self, node: Node) -> Node:
        return node

    def or_expr(self, *children: Node) -> Node:
        return Or(tuple(children))

    def and_expr(self, *children: Node) -> Node:
        return And(tuple(children))

    def not_expr(self, child: Node) -> Node:
        return Not(child)

    def macro_ref(self, tok: Token) -> Node:
        return MacroRef(str(tok))

    def field(self, tok: Token) -> FieldRef:
        return _split_field(str(tok))

    def transformed(self, tok: Token, inner: FieldRef) -> FieldRef:
        return FieldRef(inner.name, inner.arg, (str(tok)[:-1], *inner.transformers), inner.args)

    def call(self, tok: Token, *rest: FieldRef | Value | Token | None) -> FieldRef:
        selector = rest[-1]
        args = tuple(a for a in rest[:-1] if isinstance(a, (FieldRef, Value)))
        arg = str(selector)[1:-1] if isinstance(selector, Token) else None
        return FieldRef(str(tok)[:-1], arg, (), args)

    def unary_check(self, lhs: FieldRef, op: Token) -> Node:
        return UnaryCheck(lhs, str(op))

    def binary_check(self, lhs: FieldRef, op: Token, rhs: Rhs) -> Node:
        return BinaryCheck(lhs, str(op), rhs)

    def modified_check(self, lhs: FieldRef, op: Token, mod: Token, *items: Value | None) -> Node:
        return BinaryCheck(lhs, str(op), self.list_value(*items), str(mod))

    def num_rhs(self, rhs: Rhs) -> Rhs:
        return rhs

    def str_rhs(self, rhs: Rhs) -> Rhs:
        return rhs

    def list_rhs(self, rhs: Rhs) -> Rhs:
        return rhs

    def field_rhs(self, rhs: Rhs) -> Rhs:
        return rhs

    def bare_value(self, tok: Token) -> Value:
        return Value(str(tok))

    def quoted_value(self, tok: Token) -> Value:
        try:
            return Value(unquote(str(tok)), quoted=True)
        except ConditionParseError as e:
            raise ConditionParseError(str(e), tok.column) from None

    def list_value(self, *items: Value | None) -> ListValue:
        return ListValue(tuple(i for i in items if i is not None))

    def val_rhs(self, _tok: Token, inner: FieldRef) -> FieldValue:
        return FieldValue(inner)

    def transformed_rhs(self, tok: Token, inner: FieldRef) -> FieldValue:
        return FieldValue(self.transformed(tok, inner))


@lru_cache(maxsize=1)
def _parser() -> Lark:
    grammar = _GRAMMAR.replace("FIELD_RE", _FIELD_NAME + "(?:" + _FIELD_ARG + ")?")
    grammar = grammar.replace("QUOTED_RE", _QUOTED)
    words = "|".join(op for op in STR_OPS if op.isalpha())
    grammar = grammar.replace("WORD_STR_OPS_RE", f"(?:{words})(?![A-Za-z0-9_])")
    return Lark(grammar, parser="lalr", lexer="contextual", maybe_placeholders=True)


def _describe(err: UnexpectedInput, text: str) -> str:
    col = getattr(err, "column", None)
    if isinstance(err, UnexpectedCharacters):
        start = err.pos_in_stream or 0
        near = text[start : start + 20]
        return f"unexpected text {near!r} at column {col}"
    token = getattr(err, "token", None)
    if token is not None and getattr(token, "type", "") == "$END":
        return "unexpected end of condition"
    if token is not None:
        return f"unexpected token {str(token)!r} at column {col}"
    return f"syntax error at column {col}"


def parse_condition(text: str) -> Node:
    """Parse a Falco condition into an AST; raise ``ConditionParseError``."""
    if not text or not text.strip():
        raise ConditionParseError("condition is empty")
    try:
        tree = _parser().parse(text)
        node: Node = _ToAst().transform(tree)
    except UnexpectedInput as e:
        raise ConditionParseError(_describe(e, text), getattr(e, "column", None)) from None
    except LarkError as e:
        inner = getattr(e, "orig_exc", None)
        if isinstance(inner, ConditionParseError):
            raise inner from None
        raise ConditionParseError(str(e).splitlines()[0]) from None
    return node


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
        return rhs.field.text() if rhs.field.transformers else f"val({rhs.field.text()})"
    return _value_text(rhs)


def _value_text(v: Value) -> str:
    return quote_value(v.text, force=v.quoted)


def to_text(node: Node, *, _top: bool = True) -> str:
    """Render an AST back to condition text (fully parenthesised where it matters)."""
    if isinstance(node, UnaryCheck):
        return f"{node.field.text()} {node.op}"
    if isinstance(node, BinaryCheck):
        op = f"{node.op} {node.modifier}" if node.modifier else node.op
        return f"{node.field.text()} {op} {_rhs_text(node.value)}"
    if isinstance(node, MacroRef):
        return node.name
    if isinstance(node, Not):
        return "not " + to_text(node.child, _top=False)
    joiner = " and " if isinstance(node, And) else " or "
    body = joiner.join(to_text(c, _top=False) for c in node.children)
    return body if _top else f"({body})"
