"""Conformance: the upstream stable ruleset loads, validates and behaves.

The upstream file is read in place (never copied into the project).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from falco_testkit import upstream_rules

from policies.falco.engine import RuleEngine, Ruleset, RuleStatus
from policies.falco.event import ContainerInfo, Event, FdInfo, Process, UserInfo
from policies.falco.explain import explain_rule
from policies.falco.fieldapi import FieldRegistry
from policies.falco.fields import default_registry
from policies.falco.loader import load_files, load_texts
from policies.falco.validate import validate_files


@pytest.fixture(scope="module")
def upstream() -> Path:
    return upstream_rules()


@pytest.fixture(scope="module")
def reg() -> FieldRegistry:
    return default_registry()


@pytest.fixture(scope="module")
def eng(upstream: Path, reg: FieldRegistry) -> RuleEngine:
    return RuleEngine.from_files([upstream], reg, rule_matching="all")


def test_upstream_loads_without_error(upstream: Path) -> None:
    res = load_files([upstream])
    assert len(res.rules) >= 20 and res.lists and res.macros
    assert res.required_engine_version is not None


def test_every_upstream_rule_is_supported(upstream: Path, reg: FieldRegistry) -> None:
    report = validate_files([upstream], reg)
    unsupported = {r.name: r.reason for r in report.rules if r.status is not RuleStatus.SUPPORTED}
    print(f"\nupstream: {report.counts()}; missing fields: {report.missing_fields()}")
    assert report.ok, report.errors
    assert unsupported == {}


def test_upstream_strict_engine_builds(eng: RuleEngine) -> None:
    assert len(eng.ruleset.active) == len(eng.ruleset.entries)
    needed = eng.event_types()
    assert {"execve", "execveat", "open", "openat", "openat2", "connect"} <= needed
    assert eng.ruleset.unbounded_rules() == []


def _container() -> ContainerInfo:
    return ContainerInfo(full_id="c0ffee" * 10 + "abcd", image="docker.io/library/alpine:3")


def _shell_in_container() -> Event:
    parent = Process(pid=10, name="runc:[1:CHILD]", exe="runc", exepath="/usr/bin/runc")
    proc = Process(
        pid=11,
        ppid=10,
        name="bash",
        exe="bash",
        exepath="/bin/bash",
        args=["-i"],
        tty=34816,
        uid=0,
        parent=parent,
        container_id=_container().full_id,
    )
    return Event(
        type="execve",
        proc=proc,
        container=_container(),
        res=0,
        num=1,
        user=UserInfo(uid=0, name="root"),
    )


def test_terminal_shell_in_container(eng: RuleEngine) -> None:
    matched = {m.rule: m for m in eng.evaluate(_shell_in_container())}
    assert "Terminal shell in container" in matched
    m = matched["Terminal shell in container"]
    assert m.priority_name == "Notice"
    assert "process=bash" in m.output and "user=root" in m.output
    for key in ("container.id", "container.full_id", "proc.cmdline", "proc.pid"):
        assert key in m.output_fields
    assert m.output_fields["proc.pid"] == 11


def test_no_tty_no_alert(eng: RuleEngine) -> None:
    ev = _shell_in_container()
    ev.proc.tty = 0
    assert "Terminal shell in container" not in {m.rule for m in eng.evaluate(ev)}


def _open(path: str, name: str, flags: int, typechar: str = "f") -> Event:
    proc = Process(
        pid=20,
        name=name,
        exe=name,
        exepath=f"/usr/bin/{name}",
        parent=Process(pid=1, name="bash"),
        container_id=_container().full_id,
    )
    fd = FdInfo(num=3, type="file", name=path, nameraw=path, flags=flags)
    return Event(
        type="openat",
        proc=proc,
        fd=fd,
        container=_container(),
        res=3,
        num=2,
        args={"flags": flags, "name": path, "fd": 3},
        user=UserInfo(uid=0, name="root"),
    )


def test_read_sensitive_file_untrusted(eng: RuleEngine) -> None:
    hit = {m.rule for m in eng.evaluate(_open("/etc/shadow", "cat", 0))}
    assert "Read sensitive file untrusted" in hit
    # a trusted reader listed upstream is excepted
    assert "Read sensitive file untrusted" not in {
        m.rule for m in eng.evaluate(_open("/etc/shadow", "sshd", 0))
    }
    assert not eng.evaluate(_open("/etc/hostname", "cat", 0))


WRITE_BELOW_BINARY_DIR = """
- macro: bin_dir
  condition: (fd.directory in (/bin, /sbin, /usr/bin, /usr/sbin))
- list: package_mgmt_binaries
  items: [dpkg, apt, rpm, yum]
- rule: Write below binary dir
  desc: an attempt to write to any file below a set of binary directories
  condition: >
    bin_dir and open_write
    and not proc.name in (package_mgmt_binaries)
  output: File below a known binary directory opened for writing (file=%fd.name proc=%proc.name)
  priority: ERROR
  exceptions:
    - name: known_writers
      fields: [proc.name, fd.name]
      comps: [=, startswith]
      values:
        - [installer, /usr/bin/installer-]
"""


def test_write_below_binary_dir_style(upstream: Path, reg: FieldRegistry) -> None:
    # The upstream file supplies open_write; our local file adds the rule on top.
    sources = [(str(upstream), upstream.read_text()), ("local.yaml", WRITE_BELOW_BINARY_DIR)]
    load = load_texts(sources)
    eng = RuleEngine(Ruleset.build(load, reg), reg, rule_matching="all")
    o_wronly = 1

    def rules(ev: Event) -> set[str]:
        return {m.rule for m in eng.evaluate(ev)}

    assert "Write below binary dir" in rules(_open("/usr/bin/evil", "curl", o_wronly))
    [m] = [
        m
        for m in eng.evaluate(_open("/usr/bin/evil", "curl", o_wronly))
        if m.rule == "Write below binary dir"
    ]
    assert (
        m.output == "File below a known binary directory opened for writing "
        "(file=/usr/bin/evil proc=curl)"
    )
    assert "Write below binary dir" not in rules(_open("/usr/bin/evil", "curl", 0))  # read
    assert "Write below binary dir" not in rules(_open("/usr/bin/x", "dpkg", o_wronly))
    assert "Write below binary dir" not in rules(_open("/usr/bin/installer-1", "installer", 1))
    assert "Write below binary dir" not in rules(_open("/home/u/x", "curl", o_wronly))


def test_explain_upstream_rule(upstream: Path, reg: FieldRegistry) -> None:
    rs = Ruleset.build(load_files([upstream]), reg)
    ex = explain_rule(rs, "Terminal shell in container")
    assert ex.expanded_condition is not None
    assert "spawned_process" not in ex.expanded_condition  # macros inlined
    assert "proc.name in (ash, bash" in ex.expanded_condition  # lists inlined
    assert ex.event_types == ["execve", "execveat"]
    assert {"proc.name", "proc.tty", "container.id"} <= set(ex.fields)
    assert "shell_binaries" in ex.lists and "spawned_process" in ex.macros
    assert "proc.cmdline" in ex.output_fields


def test_events_reach_only_the_rules_indexed_for_their_type(eng: RuleEngine) -> None:
    """The event-type index, not a scan of every rule, decides what is evaluated
    (engine speed itself is measured by the sensor benchmark, not here)."""
    active = len(eng.ruleset.active)
    no_rule = Event(type="close", proc=Process(pid=1, name="x"))
    assert eng.candidates(no_rule) == ()
    for ev in (_shell_in_container(), _open("/etc/shadow", "cat", 0)):
        candidates = eng.candidates(ev)
        assert 0 < len(candidates) < active
        assert all(ev.type in entry.event_types for entry in candidates)
    assert {m.rule for m in eng.evaluate(_open("/tmp/x", "cat", 0))} == set()
