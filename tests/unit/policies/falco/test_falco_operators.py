"""Every operator, Falco's None semantics, list-valued fields, typed values."""

from __future__ import annotations

from typing import Any

import pytest
from falco_testkit import matches, rule, ruleset

from policies.falco.compiler import compile_predicate
from policies.falco.fields import default_registry
from policies.falco.grammar import ConditionParseError, parse_condition, to_text
from policies.falco.loader import RuleLoadError

Case = tuple[str, dict[str, Any], bool]

CASES: list[Case] = [
    # equality
    ("proc.name = bash", {"proc.name": "bash"}, True),
    ("proc.name == bash", {"proc.name": "bash"}, True),
    ("proc.name = bash", {"proc.name": "Bash"}, False),  # case-sensitive
    ("proc.name != bash", {"proc.name": "sh"}, True),
    ("proc.name != bash", {"proc.name": "bash"}, False),
    ('proc.cmdline = "sh -c ls"', {"proc.cmdline": "sh -c ls"}, True),
    ("proc.cmdline = 'it\\'s'", {"proc.cmdline": "it's"}, True),
    # numbers
    ("fd.num >= 0", {"fd.num": 0}, True),
    ("fd.num >= 0", {"fd.num": -1}, False),
    ("fd.num = -1", {"fd.num": -1}, True),
    ("fd.num < 3", {"fd.num": 2}, True),
    ("fd.num <= 2", {"fd.num": 3}, False),
    ("fd.num > 0x10", {"fd.num": 17}, True),
    ("proc.duration <= 5000000000", {"proc.duration": 4_000_000_000}, True),
    ("evt.rawres in (0, 1, 2)", {"evt.rawres": 1}, True),
    ("evt.rawres in (0, 1, 2)", {"evt.rawres": 3}, False),
    ("user.uid = 0", {"user.uid": "0"}, True),  # extractor returned text: normalised
    # booleans
    ("evt.is_open_write = true", {"evt.is_open_write": True}, True),
    ("evt.is_open_write = true", {"evt.is_open_write": False}, False),
    ("evt.is_open_write = false", {"evt.is_open_write": False}, True),
    # strings
    ("proc.cmdline contains -jar", {"proc.cmdline": "java -jar x"}, True),
    ("proc.cmdline contains -jar", {"proc.cmdline": "java -JAR x"}, False),
    ("proc.args icontains 'BEGIN PRIVATE'", {"proc.args": "-e begin private key"}, True),
    ("fd.name startswith /etc/", {"fd.name": "/etc/shadow"}, True),
    ("fd.name startswith /etc/", {"fd.name": "/etcx"}, False),
    ("proc.exe endswith java", {"proc.exe": "/usr/bin/java"}, True),
    ("evt.res startswith E", {"evt.res": "ENOENT"}, True),
    ("evt.res startswith E", {"evt.res": "SUCCESS"}, False),
    # glob (fnmatch without flags: * crosses '/')
    ("fd.name glob '/home/*/.ssh/*'", {"fd.name": "/home/u/.ssh/id_rsa"}, True),
    ("fd.name glob '/home/*/.ssh/*'", {"fd.name": "/home/a/b/.ssh/k"}, True),
    ("fd.name glob '/home/*/.ssh/*'", {"fd.name": "/root/.ssh/k"}, False),
    ("fd.name glob '/tmp/?.[ch]'", {"fd.name": "/tmp/a.c"}, True),
    ("fd.name glob '/tmp/[!a]'", {"fd.name": "/tmp/a"}, False),
    ("fd.name glob '/tmp/[^a]'", {"fd.name": "/tmp/b"}, True),
    ("fd.name glob '*.TXT'", {"fd.name": "a.txt"}, False),
    ("fd.name iglob '*.TXT'", {"fd.name": "a.txt"}, True),
    ("fd.name glob 'a\\\\b'", {"fd.name": "a\\b"}, True),  # backslash is literal
    # regex: full match
    ("proc.name regex 'ba[sh]+'", {"proc.name": "bash"}, True),
    ("proc.name regex 'ba'", {"proc.name": "bash"}, False),
    # in / intersects / pmatch
    ("proc.name in (bash, sh, 'my app')", {"proc.name": "my app"}, True),
    ("proc.name in (bash, sh)", {"proc.name": "zsh"}, False),
    ("proc.name in ()", {"proc.name": "zsh"}, False),
    ("proc.name intersects (bash, sh)", {"proc.name": "sh"}, True),
    ("fd.name pmatch (/etc, /usr/bin/)", {"fd.name": "/etc/passwd"}, True),
    ("fd.name pmatch (/etc, /usr/bin/)", {"fd.name": "/usr/bin"}, True),
    ("fd.name pmatch (/etc, /usr/bin/)", {"fd.name": "/etcetera/x"}, False),
    ("fd.name pmatch (/)", {"fd.name": "/anything"}, True),
    # bytes
    ("evt.buffer bcontains 6c73", {"evt.buffer": "ls -la"}, True),
    ("evt.buffer bcontains CAFEBABE", {"evt.buffer": b"\x00\xca\xfe\xba\xbe"}, True),
    ("evt.buffer bstartswith 7f454c46", {"evt.buffer": b"\x7fELF..."}, True),
    ("evt.buffer bstartswith 7f454c46", {"evt.buffer": b"#!/bin/sh"}, False),
    # exists
    ("proc.pname exists", {"proc.pname": "bash"}, True),
    ("proc.pname exists", {}, False),
    ("not proc.pname exists", {}, True),
    # boolean logic and precedence: not > and > or
    ("proc.name = a or proc.name = b and user.name = root", {"proc.name": "a"}, True),
    ("(proc.name = a or proc.name = b) and user.name = root", {"proc.name": "a"}, False),
    ("not proc.name = a and user.name = root", {"proc.name": "b", "user.name": "root"}, True),
    ("not not proc.name = a", {"proc.name": "a"}, True),
    ("not(proc.name = a)", {"proc.name": "b"}, True),
    # arguments
    ("proc.aname[2] = sshd", {"proc.aname[2]": "sshd"}, True),
    ("evt.arg.flags contains O_TRUNC", {"evt.arg[flags]": "O_WRONLY|O_TRUNC"}, True),
    ("evt.arg[flags] contains O_TRUNC", {"evt.arg[flags]": "O_WRONLY"}, False),
    # IP addresses and networks
    ('fd.sip = "10.0.0.1"', {"fd.sip": "10.0.0.1"}, True),
    ('fd.sip != "0.0.0.0"', {"fd.sip": "10.0.0.1"}, True),
    ('fd.sip = "10.0.0.0/8"', {"fd.sip": "10.2.3.4"}, True),
    ('fd.snet in ("10.0.0.0/8", "192.168.0.0/16")', {"fd.snet": "192.168.1.9"}, True),
    ('fd.snet in ("10.0.0.0/8", "192.168.0.0/16")', {"fd.snet": "8.8.8.8"}, False),
    ('fd.snet != "127.0.0.0/8"', {"fd.snet": "127.0.0.1"}, False),
    ("fd.sport in (80, 443)", {"fd.sport": 443}, True),
    # transformers and field-to-field comparison
    ("tolower(proc.name) = bash", {"proc.name": "BASH"}, True),
    ("toupper(proc.name) = BASH", {"proc.name": "bash"}, True),
    ("basename(proc.exe) = java", {"proc.exe": "/usr/bin/java"}, True),
    ("len(proc.name) > 3", {"proc.name": "bash"}, True),
    ("proc.name = val(proc.pname)", {"proc.name": "bash", "proc.pname": "bash"}, True),
    ("proc.name = val(proc.pname)", {"proc.name": "bash", "proc.pname": "sh"}, False),
    ("proc.name = val(proc.pname)", {"proc.name": "bash"}, False),
]


@pytest.mark.parametrize(("condition", "event", "expected"), CASES)
def test_operator(condition: str, event: dict[str, Any], expected: bool) -> None:
    assert matches(condition, event) is expected


NONE_OPS = [
    "proc.name = x",
    "proc.name != x",
    "proc.name contains x",
    "proc.name icontains x",
    "proc.name startswith x",
    "proc.name endswith x",
    "proc.name glob '*'",
    "proc.name regex '.*'",
    "proc.name in (x, y)",
    "proc.name intersects (x)",
    "proc.name pmatch (/)",
    "evt.buffer bcontains 78",
    "fd.num < 1",
    "fd.num >= 0",
    "fd.num != 3",
    "evt.is_open_write = false",
    'fd.sip != "1.2.3.4"',
]


@pytest.mark.parametrize("condition", NONE_OPS)
def test_every_comparison_on_a_missing_value_is_false(condition: str) -> None:
    assert matches(condition, {}) is False
    assert matches(f"not {condition}", {}) is True  # so negation of a missing value is true


def test_list_valued_fields_mean_any() -> None:
    ev = {"proc.aname": ["bash", "sshd", "systemd"]}
    assert matches("proc.aname = sshd", ev)
    assert matches("proc.aname in (nginx, systemd)", ev)
    assert matches("proc.aname startswith sys", ev)
    assert not matches("proc.aname in (nginx, httpd)", ev)
    assert not matches("proc.aname = sshd", {"proc.aname": []})
    assert not matches("proc.aname exists", {"proc.aname": []})
    assert matches("proc.name in (bash)", {"proc.name": ["zsh", "bash"]})  # any extractor list


def test_bad_values_are_load_errors() -> None:
    with pytest.raises(RuleLoadError, match="not a valid int"):
        ruleset(rule("r", "fd.num = abc"))
    with pytest.raises(RuleLoadError, match="hexadecimal"):
        ruleset(rule("r", "evt.buffer bcontains xyz"))
    with pytest.raises(RuleLoadError, match="invalid regex"):
        ruleset(rule("r", "proc.name regex '('"))
    with pytest.raises(RuleLoadError, match="not a valid bool"):
        ruleset(rule("r", "evt.is_open_write = maybe"))


def test_field_argument_rules() -> None:
    with pytest.raises(RuleLoadError, match="does not take an argument"):
        ruleset(rule("r", "proc.name[1] = x"))
    with pytest.raises(RuleLoadError, match="requires an argument"):
        ruleset(rule("r", "evt.arg = x"))


@pytest.mark.parametrize(
    "text",
    [
        "proc.name =",
        "proc.name bash",
        "(proc.name = a",
        "fd.num > abc",
        "proc.name = a b",
        'proc.name = "unterminated',
        'proc.name = "bad \\q escape"',
        "proc.name in (a, b",
    ],
)
def test_syntax_errors(text: str) -> None:
    with pytest.raises(ConditionParseError):
        parse_condition(text)


def test_string_escapes() -> None:
    node = parse_condition(r'proc.cmdline = "a\"b\\c\td" and fd.name = ' + r"'it\'s'")
    assert to_text(node) == r'proc.cmdline = "a\"b\\c\td" and fd.name = "it' + "'" + 's"'
    assert matches(r'proc.cmdline = "a\"b"', {"proc.cmdline": 'a"b'})


def test_bare_values_take_falco_characters() -> None:
    cond = "proc.pname in (runc:[0:PARENT], runc:[1:CHILD], <NA>, 10_etc_sudoers.)"
    assert matches(cond, {"proc.pname": "runc:[1:CHILD]"})
    assert matches(cond, {"proc.pname": "<NA>"})


def test_keywords_need_word_boundaries() -> None:
    # "andy" and "notx" are macros, not and/not
    node = parse_condition("andy or notx")
    assert to_text(node) == "andy or notx"


@pytest.mark.parametrize(
    ("condition", "event", "expected"),
    [  # values of libs' transformer tests (a stored copy of filter_transformer.ut.cpp)
        ("toupper(proc.name) = EXCITED", {"proc.name": "eXcItED"}, True),
        ("tolower(proc.name) = 'not excited'", {"proc.name": "NoT eXcItED"}, True),
        ("b64(proc.name) = 'world !'", {"proc.name": "d29ybGQgIQ=="}, True),
        ("basename(fd.name) = hello.txt", {"fd.name": "/home/ubuntu/hello.txt"}, True),
        ("basename(fd.name) = ''", {"fd.name": "/"}, True),
        ("basename(fd.name) = ''", {"fd.name": "/hello/"}, True),
        ("basename(fd.name) = hello", {"fd.name": "hello"}, True),
        ("len(fd.name) = 22", {"fd.name": "/home/ubuntu/hello.txt"}, True),
        ("len(proc.aname) = 2", {"proc.aname": ["ipv4", "file"]}, True),
        ("len(proc.aname) = 0", {"proc.aname": []}, True),
    ],
)
def test_transformers_like_libs(condition: str, event: dict[str, object], expected: bool) -> None:
    assert matches(condition, {"evt.type": "open", **event}) is expected


@pytest.mark.parametrize(
    "condition",
    [  # libsinsp: fields with their own comparison logic take no field on the right, nor go there
        "fd.ip = val(fd.sip)",
        "fd.sip = val(fd.ip)",
        "fd.net = val(fd.snet)",
        "proc.aname[2] = val(proc.name)",
        "proc.name = val(proc.aname[1])",
        "evt.rawarg.res = val(evt.rawres)",
        "proc.name = val(evt.is_io)",  # a string against a bool
        "proc.name = val(proc.pname)[x]",  # val() takes no [arg]
    ],
)
def test_field_comparisons_libsinsp_refuses(condition: str) -> None:
    with pytest.raises(RuleLoadError):
        compile_predicate(parse_condition(condition), default_registry(), None)


def test_field_comparisons_libsinsp_takes() -> None:
    for condition in ("proc.vpid = val(proc.pid)", "fd.sip = val(fd.cip)",
                      "tolower(proc.name) = toupper(proc.pname)"):  # fmt: skip
        compile_predicate(parse_condition(condition), default_registry(), None)


def test_case_changes_ascii_letters_only() -> None:
    # libsinsp changes case byte by byte (C's toupper): non-ASCII letters stay as they are
    ev = {"proc.name": "straße-é"}
    assert matches("toupper(proc.name) = STRAßE-é", ev)
    assert not matches("proc.name icontains É", ev)
    assert matches("proc.name iglob STRA*", ev)
