"""libsinsp's own filter tests, run against this engine.

The inputs live in ``conformance/libs_parser.yaml`` (every accept/reject input
of libs' ``filter_parser.ut.cpp``) and ``conformance/libs_compiler.yaml`` (the
filters of ``filter_compiler.ut.cpp``, ``filter_transformer.ut.cpp``,
``filterchecks/cmp_operator_modifiers.cpp`` and ``filter_op_*.ut.cpp``: does
libs compile them, refuse them, or what do they evaluate to on a test event).
A case this engine knowingly answers otherwise carries ``gap:`` (why); the test
then expects the miss, so fixing it means deleting the note. A case refused on
purpose (``refused_on_purpose: "<field>: <reason>"``) must be refused with an
error that names the field.

Print the pass rates (``docs/falco-fidelity.md`` quotes them):
``.venv/bin/python tests/unit/policies/falco/test_falco_libs_conformance.py``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from policies.falco.compiler import compile_predicate
from policies.falco.event import Event, FdInfo, Process
from policies.falco.fieldapi import FieldRegistry, FieldSpec, FieldType
from policies.falco.fields import default_registry
from policies.falco.grammar import ConditionParseError, parse_condition
from policies.falco.lint import condition_warnings
from policies.falco.loader import RuleLoadError

CASES_DIR = Path(__file__).with_name("conformance")


@dataclass(frozen=True, slots=True)
class ParserCase:
    test: str
    text: str
    accept: bool
    variants: bool = True
    gap: str | None = None

    @property
    def id(self) -> str:
        return f"{'accept' if self.accept else 'reject'}:{self.text[:60]!r}"


@dataclass(frozen=True, slots=True)
class CompilerCase:
    source: str
    test: str
    filter: str
    expect: str | bool  # "compiles" | "refused" | True | False (evaluated on `event`)
    event: str | None = None
    mock: bool = False
    warnings: int | None = None
    refused_on_purpose: str | None = None
    gap: str | None = None

    @property
    def id(self) -> str:
        return f"{self.test}:{self.filter[:70]!r}"


def parser_cases() -> list[ParserCase]:
    raw = yaml.safe_load((CASES_DIR / "libs_parser.yaml").read_text(encoding="utf-8"))
    cases = []
    for item in raw:
        accept = "accept" in item
        text = item["accept"] if accept else item["reject"]
        text = text * item.get("repeat", 1)
        cases.append(ParserCase(item["test"], text, accept, item.get("variants", True),
                                item.get("gap")))  # fmt: skip
    return cases


def compiler_cases() -> list[CompilerCase]:
    raw = yaml.safe_load((CASES_DIR / "libs_compiler.yaml").read_text(encoding="utf-8"))
    return [CompilerCase(**item) for item in raw]


# --- parser ------------------------------------------------------------------


def _parses(text: str) -> bool:
    try:
        parse_condition(text)
    except ConditionParseError:
        return False
    return True


@cache
def parser_agrees(case: ParserCase) -> bool:
    if not case.accept:
        return not _parses(case.text)
    inputs = [case.text]
    if case.variants:  # libs' test_accept: padded, then spaces -> line breaks, then tabs
        padded = f" {case.text} "
        inputs += [padded, padded.replace(" ", "\n"), padded.replace(" ", "\t")]
    return all(_parses(t) for t in inputs)


# --- compiler ------------------------------------------------------------------


def _const(value: Any) -> Callable[[Any, Any], Any]:
    return lambda _ev, _arg: value


def _registry(mock: bool) -> FieldRegistry:
    reg = default_registry()
    if mock:  # libs' mock filterchecks: c.true holds for any value, c.false for none
        reg.add(FieldSpec("c.true", FieldType.STRING, _const("1")))
        reg.add(FieldSpec("c.false", FieldType.STRING, _const("0")))
        reg.add(FieldSpec("c.buffer", FieldType.BYTES, _const(b"")))
        reg.add(FieldSpec("c.singlequote", FieldType.STRING, _const("hello 'quoted'")))
        reg.add(FieldSpec("c.doublequote", FieldType.STRING, _const('hello "quoted"')))
    return reg


_REGISTRIES = {False: _registry(False), True: _registry(True)}


def _init() -> Process:
    return Process(pid=1, name="init", exe="/sbin/init", exepath="/sbin/init", args=[])


def libs_event(name: str) -> Event:
    """The events libs' tests evaluate on (sinsp_with_test_input's generators)."""
    proc = _init()
    if name == "getcwd_failed_entry":
        return Event("getcwd", ">", tid=1, pid=1, num=1, proc=proc, res=-2,
                     args={"res": -2, "path": "/test/dir"})  # fmt: skip
    if name == "open_file_to_run":
        fd = FdInfo(3, "file", "/tmp/file_to_run", "/tmp/file_to_run")
        proc.fds[3] = fd
        return Event("open", "<", tid=1, pid=1, num=1, proc=proc, fd=fd, res=3,
                     args={"fd": 3, "name": "/tmp/file_to_run", "flags": 0})  # fmt: skip
    if name == "socket_exit":
        proc.fds[3] = FdInfo(3, "file", "/tmp/file_to_run")
        fd = FdInfo(4, "ipv4", "", sockfamily="ip")
        proc.fds[4] = fd
        return Event("socket", "<", tid=1, pid=1, num=2, proc=proc, fd=fd, res=4,
                     args={"fd": 4, "domain": 2, "type": 1, "proto": 0})  # fmt: skip
    if name == "read_6_bytes":
        return Event("read", "<", tid=1, pid=1, num=1, proc=proc, res=0,
                     args={"fd": 0, "data": bytes([1, 2, 3, 4, 5, 6]), "size": 0})  # fmt: skip
    if name == "execve_myexe":
        proc = Process(pid=1, name="myexe", exe="/myexe", exepath="/myexe", args=[])
        return Event("execve", "<", tid=1, pid=1, num=2, proc=proc, res=0,
                     args={"res": 0, "exe": "/myexe", "args": ""})  # fmt: skip
    if name in ("read_hello", "read_a_nul_b"):
        data = b"hello" if name == "read_hello" else b"a\x00b"
        return Event("read", "<", tid=1, pid=1, num=1, proc=proc, res=0,
                     args={"fd": 0, "data": data, "size": 0})  # fmt: skip
    if name in ("open_opt_dir_SUBDIR", "open_opt_dir_subdir"):
        path = "/opt/dir/SUBDIR/file.txt" if name.endswith("SUBDIR") else "/opt/dir/subdir/file.txt"
        flags = os.O_RDWR | os.O_CREAT if name.endswith("SUBDIR") else 0
        fd = FdInfo(1, "file", path, path, flags=flags)
        return Event("open", "<", tid=3, pid=3, num=1, proc=proc, fd=fd, res=1,
                     args={"fd": 1, "name": path, "flags": flags, "mode": 0})  # fmt: skip
    if name == "epoll_create_einval":
        return Event("epoll_create", "<", tid=1, pid=1, num=1, proc=proc, res=-22, cpu=1,
                     args={"res": -22, "size": 0})  # fmt: skip
    if name == "open_failed":
        fd = FdInfo(-1, "file", "/tmp/the_file", "/tmp/the_file")
        args = {"fd": -1, "name": "/tmp/the_file", "flags": 0, "mode": 0o666}
        return Event("open", "<", tid=1, pid=1, num=1, proc=proc, fd=fd, res=-1, args=args)
    if name in ("connect_ipv4", "connect_ipv6"):
        # libs reads its test socket with the server end as the local one (fd.lip is the
        # server's address, fd.rip the client's): is_server gives the same fields here.
        v4 = name == "connect_ipv4"
        server, client = (
            ("142.251.111.147", "172.40.111.222") if v4 else ("2001:4860:4860::8888", "::1")
        )
        fd = FdInfo(3, "ipv4" if v4 else "ipv6", f"{client}:54321->{server}:443", sockfamily="ip",
                    l4proto="tcp", lip=server, lport=443, rip=client, rport=54321, is_server=True,
                    connected=True)  # fmt: skip
        return Event("connect", "<", tid=1, pid=1, num=1, proc=proc, fd=fd, res=0,
                     args={"res": 0, "fd": 3})  # fmt: skip
    if name == "proc_exit":
        args = {"status": 0, "ret": 0, "sig": 0, "core": 0, "reaper_tid": 1}
        return Event("procexit", "<", tid=2, pid=2, num=1, proc=Process(pid=2), args=args)
    raise KeyError(name)


@cache
def outcome(case: CompilerCase) -> tuple[str | bool, str]:
    """("compiles" | "refused" | the evaluation, the error message if refused)."""
    try:
        node = parse_condition(case.filter)
        pred = compile_predicate(node, _REGISTRIES[case.mock], None)
    except (ConditionParseError, RuleLoadError) as err:
        return "refused", str(err)
    if isinstance(case.expect, bool):
        return bool(pred(libs_event(case.event) if case.event else None)), ""
    warnings = condition_warnings(node, _REGISTRIES[case.mock])
    if case.warnings is not None and len(warnings) != case.warnings:
        return f"compiles with {len(warnings)} warnings, not {case.warnings}", "; ".join(warnings)
    return "compiles", ""


def compiler_agrees(case: CompilerCase) -> bool:
    got, message = outcome(case)
    if case.refused_on_purpose:
        field = case.refused_on_purpose.partition(":")[0]
        return got == "refused" and field in message
    return got == case.expect


PARSER = parser_cases()
COMPILER = compiler_cases()


@pytest.mark.parametrize("case", PARSER, ids=[c.id for c in PARSER])
def test_libs_parser_case(case: ParserCase) -> None:
    if case.gap:
        assert not parser_agrees(case), f"now agrees with libs: drop the gap note ({case.gap})"
        return
    assert parser_agrees(case), f"libs {'accepts' if case.accept else 'rejects'} {case.text!r}"


@pytest.mark.parametrize("case", COMPILER, ids=[c.id for c in COMPILER])
def test_libs_compiler_case(case: CompilerCase) -> None:
    if case.gap:
        assert not compiler_agrees(case), f"now agrees with libs: drop the gap note ({case.gap})"
        return
    got, message = outcome(case)
    assert compiler_agrees(case), f"libs: {case.expect}; here: {got} {message}"


def same_verdict(case: CompilerCase) -> bool:
    """libs' own verdict, not counting refusals on purpose."""
    return not case.refused_on_purpose and outcome(case)[0] == case.expect


def rates() -> dict[str, tuple[int, int]]:
    """name -> (passed, total); "agrees" counts a refusal on purpose as passed."""
    out = {"libs parser": (sum(map(parser_agrees, PARSER)), len(PARSER))}
    sources = (
        "filter_compiler",
        "filter_transformer",
        "cmp_operator_modifiers",
        "filter_op_",
        None,
    )
    for source in sources:
        cases = [c for c in COMPILER if source is None or c.source.startswith(source)]
        name = {None: "compiler, all", "filter_op_": "filter_op_*"}.get(source, source)
        out[f"{name}: agrees"] = (sum(map(compiler_agrees, cases)), len(cases))
        out[f"{name}: same verdict"] = (sum(map(same_verdict, cases)), len(cases))
    on_purpose = [c for c in COMPILER if c.refused_on_purpose]
    out["refused on purpose, by name"] = (sum(map(compiler_agrees, on_purpose)), len(on_purpose))
    return out


def test_pass_rates() -> None:
    """The headline numbers: the parser at 100%, the compiler at its floor."""
    found = rates()
    passed, total = found["libs parser"]
    assert passed == total
    passed, total = found["compiler, all: agrees"]
    assert passed == total


def main() -> None:
    for name, (passed, total) in rates().items():
        print(f"{name:36s} {passed:4d}/{total:<4d} {100 * passed / total:5.1f}%")
    for p in PARSER:
        if not parser_agrees(p):
            print(f"  parser differs: {p.id}", file=sys.stderr)
    for c in COMPILER:
        if not compiler_agrees(c):
            got, message = outcome(c)
            print(f"  compiler differs: {c.id} libs={c.expect} here={got} {message[:90]}",
                  file=sys.stderr)  # fmt: skip


if __name__ == "__main__":
    main()
