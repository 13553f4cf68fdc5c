"""Shared helpers for the Falco engine tests: a dict-backed field registry."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from policies.falco.engine import RuleEngine, Ruleset
from policies.falco.fieldapi import ArgKind, FieldRegistry, FieldSpec, FieldType
from policies.falco.loader import LoadResult, load_texts

S, N, B, L = FieldType.STRING, FieldType.INT, FieldType.BOOL, FieldType.LIST


def _key(name: str) -> Any:
    # Events are plain dicts: "proc.aname[2]" for an argument, "proc.aname" for the list.
    return lambda ev, arg: ev.get(name if arg is None else f"{name}[{arg}]")


_FIELDS: list[tuple[str, FieldType, ArgKind]] = [
    ("evt.type", S, ArgKind.NONE),
    ("evt.num", N, ArgKind.NONE),
    ("evt.res", S, ArgKind.NONE),
    ("evt.rawres", N, ArgKind.NONE),
    ("evt.buffer", FieldType.BYTES, ArgKind.NONE),
    ("evt.is_open_write", B, ArgKind.NONE),
    ("evt.is_open_read", B, ArgKind.NONE),
    ("evt.arg", S, ArgKind.REQUIRED),
    ("proc.name", S, ArgKind.NONE),
    ("proc.pname", S, ArgKind.NONE),
    ("proc.cmdline", S, ArgKind.NONE),
    ("proc.pid", N, ArgKind.NONE),
    ("proc.args", S, ArgKind.NONE),
    ("proc.exe", S, ArgKind.NONE),
    ("proc.aname", S, ArgKind.OPTIONAL),
    ("proc.duration", FieldType.RELTIME, ArgKind.NONE),
    ("proc.tty", N, ArgKind.NONE),
    ("fd.name", S, ArgKind.NONE),
    ("fd.directory", S, ArgKind.NONE),
    ("fd.typechar", S, ArgKind.NONE),
    ("fd.num", N, ArgKind.NONE),
    ("fd.sip", FieldType.IPADDR, ArgKind.NONE),
    ("fd.snet", FieldType.IPNET, ArgKind.NONE),
    ("fd.sport", FieldType.PORT, ArgKind.NONE),
    ("container.id", S, ArgKind.NONE),
    ("container.full_id", S, ArgKind.NONE),
    ("user.name", S, ArgKind.NONE),
    ("user.uid", N, ArgKind.NONE),
]


def registry(extra: list[FieldSpec] | None = None) -> FieldRegistry:
    reg = FieldRegistry(FieldSpec(n, t, _key(n), a) for n, t, a in _FIELDS)
    for spec in extra or []:
        reg.add(spec)
    return reg


def load(*texts: str) -> LoadResult:
    return load_texts((f"file{i}.yaml", t) for i, t in enumerate(texts, 1))


def ruleset(*texts: str, strict: bool = True) -> Ruleset:
    return Ruleset.build(load(*texts), registry(), strict=strict)


def engine(*texts: str, rule_matching: Any = "all", strict: bool = True) -> RuleEngine:
    return RuleEngine.from_texts(
        ((f"file{i}.yaml", t) for i, t in enumerate(texts, 1)),
        registry(),
        strict=strict,
        rule_matching=rule_matching,
    )


def rule(name: str, condition: str, output: str = "out", priority: str = "WARNING") -> str:
    return (
        f"- rule: {name}\n  desc: d\n  condition: {condition}\n"
        f"  output: {output}\n  priority: {priority}\n"
    )


def matches(condition: str, event: dict[str, Any]) -> bool:
    """Does ``condition`` (with the test registry) hold for ``event``?"""
    eng = engine(rule("t", _yaml_scalar(condition)))
    return bool(eng.evaluate(event))


def _yaml_scalar(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def upstream_rules() -> Path:
    """The upstream stable ruleset (conformance data), read in place; skip if absent."""
    candidates = []
    if os.environ.get("CORRAL_SHARED_DIR"):
        candidates.append(Path(os.environ["CORRAL_SHARED_DIR"]) / "falco/upstream/falco_rules.yaml")
    repo = Path(__file__).resolve().parents[4]
    candidates.append(repo / ".." / "shared" / "falco" / "upstream" / "falco_rules.yaml")
    for path in candidates:
        if path.is_file():
            return path.resolve()
    pytest.skip(
        "upstream Falco rules not found: set CORRAL_SHARED_DIR or place them at "
        "../shared/falco/upstream/falco_rules.yaml next to the repository"
    )
