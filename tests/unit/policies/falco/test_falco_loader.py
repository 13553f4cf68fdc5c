"""Loader: lists, macros, rules, exceptions, overrides, ordering and errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from falco_testkit import engine, load, rule, ruleset

from contract.errors import CorralError
from contract.priority import Priority
from policies.falco.compiler import condition_with_exceptions
from policies.falco.engine import RuleStatus
from policies.falco.loader import (
    ConditionSyntaxError,
    RuleLoadError,
    UnknownFieldError,
    load_files,
)

BASE = """
- list: shells
  items: [bash, sh]
- macro: spawned
  condition: evt.type = execve
- rule: Shell
  desc: a shell
  condition: spawned and proc.name in (shells)
  output: shell %proc.name
  priority: warning
  tags: [b, a]
"""


def test_lists_macros_rules_are_read() -> None:
    res = load(BASE)
    assert res.lists["shells"].items == ["bash", "sh"]
    assert res.macros["spawned"].condition == "evt.type = execve"
    r = res.rules["Shell"]
    assert (r.priority, r.tags) == (Priority.WARNING, ["b", "a"])
    assert (r.source, r.enabled) == ("syscall", True)
    assert r.ctx.file == "file1.yaml" and r.ctx.line == 6


def test_plain_scalars_stay_strings() -> None:
    res = load("- list: l\n  items: [010, yes, 1.50, null_not]\n")
    assert res.lists["l"].items == ["010", "yes", "1.50", "null_not"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("EMERGENCY", Priority.EMERGENCY),
        ("alert", Priority.ALERT),
        ("Critical", Priority.CRITICAL),
        ("error", Priority.ERROR),
        ("WARNING", Priority.WARNING),
        ("notice", Priority.NOTICE),
        ("INFO", Priority.INFORMATIONAL),
        ("informational", Priority.INFORMATIONAL),
        ("debug", Priority.DEBUG),
    ],
)
def test_priorities(text: str, expected: Priority) -> None:
    assert load(rule("r", "evt.num = 1", priority=text)).rules["r"].priority is expected


def test_priority_names_as_falco_prints_them() -> None:
    assert Priority.INFORMATIONAL.falco_name == "Informational"
    assert Priority.WARNING.falco_name == "Warning"


def test_bad_priority_names_file_rule_and_reason() -> None:
    with pytest.raises(RuleLoadError) as err:
        load(rule("Bad one", "evt.num = 1", priority="LOUD"))
    msg = str(err.value)
    assert "file1.yaml:1" in msg and "rule 'Bad one'" in msg and "invalid priority 'LOUD'" in msg
    assert "\n" not in msg and isinstance(err.value, CorralError)


def test_missing_required_key() -> None:
    with pytest.raises(RuleLoadError, match=r"rule 'r': missing required key 'output'"):
        load("- rule: r\n  desc: d\n  condition: evt.num=1\n  priority: INFO\n")


def test_malformed_yaml_names_file_and_line() -> None:
    with pytest.raises(RuleLoadError, match=r"file1.yaml:3: invalid YAML"):
        load("- list: a\n  items: [a, b\n- rule: x\n")


def test_top_level_must_be_a_sequence() -> None:
    with pytest.raises(RuleLoadError, match="sequence"):
        load("rule: x\n")


def test_empty_file_is_fine() -> None:
    assert load("").rules == {}


def test_unknown_item_and_keys_warn() -> None:
    res = load("- foo: bar\n" + rule("r", "evt.num=1") + "  colour: red\n")
    text = " ".join(str(w) for w in res.warnings)
    assert "unknown top level item" in text and "colour" in text


def test_versions_are_recorded() -> None:
    res = load(
        "- required_engine_version: 0.57.0\n"
        "- required_plugin_versions:\n    - name: container\n      version: 0.4.0\n"
    )
    assert res.required_engine_version == "0.57.0"
    assert res.required_plugin_versions == [{"name": "container", "version": "0.4.0"}]


def test_other_sources_are_unsupported_not_errors() -> None:
    rs = ruleset(rule("k8s", "ka.verb = create") + "  source: k8s_audit\n")
    entry = rs.get("k8s")
    assert entry is not None and entry.status is RuleStatus.UNSUPPORTED
    assert entry.reason == "unsupported source 'k8s_audit'"


def test_lists_reference_lists_and_quoted_items() -> None:
    eng = engine(
        "- list: a\n  items: [x, '\"two words\"']\n"
        "- list: b\n  items: [a, y]\n" + rule("r", "proc.name in (b, z)")
    )
    for name in ("x", "two words", "y", "z"):
        assert eng.evaluate({"proc.name": name}), name
    assert not eng.evaluate({"proc.name": "a"})
    assert not eng.evaluate({"proc.name": '"two words"'})


def test_list_defined_after_use_is_resolved() -> None:
    eng = engine(rule("r", "proc.name in (later)") + "- list: later\n  items: [cat]\n")
    assert eng.evaluate({"proc.name": "cat"})


def test_macros_reference_macros_and_bare_identifiers() -> None:
    eng = engine(
        "- macro: m1\n  condition: proc.name = cat\n"
        "- macro: m2\n  condition: m1 or proc.name = dog\n" + rule("r", "m2 and not m1")
    )
    assert eng.evaluate({"proc.name": "dog"})
    assert not eng.evaluate({"proc.name": "cat"})


def test_undefined_macro_is_an_error() -> None:
    with pytest.raises(RuleLoadError, match=r"rule 'r': undefined macro 'nope'"):
        ruleset(rule("r", "nope and proc.name = x"))


def test_macro_sees_only_macros_defined_before_it() -> None:
    # Falco's visibility order: a forward reference is an undefined macro.
    with pytest.raises(RuleLoadError, match="undefined macro 'b'") as err:
        ruleset("- macro: a\n  condition: b\n- macro: b\n  condition: proc.name = x\n")
    assert err.value.code == "LOAD_ERR_VALIDATE"


def test_recursive_macro_is_an_error() -> None:
    # An append makes later macros visible, which is how a cycle can form.
    with pytest.raises(RuleLoadError, match="references itself"):
        ruleset(
            "- macro: a\n  condition: proc.name = x\n- macro: b\n  condition: a\n"
            "- macro: a\n  condition: or b\n  override:\n    condition: append\n"
        )


def test_syntax_error_names_rule() -> None:
    with pytest.raises(ConditionSyntaxError, match=r"rule 'r': invalid condition"):
        ruleset(rule("r", "proc.name ="))


def test_unknown_field_names_rule_and_field() -> None:
    with pytest.raises(UnknownFieldError) as err:
        ruleset(rule("Uses k8s", "k8s.pod.name = x"))
    assert err.value.field == "k8s.pod.name"
    assert "rule 'Uses k8s'" in str(err.value) and "k8s.pod.name" in str(err.value)


def test_skip_if_unknown_filter_skips_with_warning() -> None:
    rs = ruleset(rule("r", "k8s.pod.name = x") + "  skip-if-unknown-filter: true\n")
    entry = rs.get("r")
    assert entry is not None and entry.status is RuleStatus.UNSUPPORTED
    assert any("skip-if-unknown-filter" in str(w) for w in rs.warnings)


def test_non_strict_reports_unknown_fields() -> None:
    rs = ruleset(rule("r", "k8s.pod.name = x and k8s.ns.name = y"), strict=False)
    entry = rs.get("r")
    assert entry is not None and entry.missing_fields == ["k8s.ns.name", "k8s.pod.name"]


# --- exceptions -----------------------------------------------------------------

EXC_RULE = rule("Write bin", "evt.type = open and fd.directory in (/bin, /usr/bin)")


def test_tuple_exceptions_expand_like_falco() -> None:
    res = load(
        EXC_RULE + "  exceptions:\n"
        "    - name: known\n      fields: [proc.name, fd.name]\n      comps: [=, startswith]\n"
        "      values:\n        - [apt, /usr/bin/apt]\n        - [my app, /bin/x]\n"
    )
    text = condition_with_exceptions(res.rules["Write bin"])
    assert text == (
        "(evt.type = open and fd.directory in (/bin, /usr/bin)) and not "
        "((proc.name = apt and fd.name startswith /usr/bin/apt) or "
        '(proc.name = "my app" and fd.name startswith /bin/x))'
    )


def test_exceptions_semantics_and_default_comps() -> None:
    eng = engine(
        "- list: pkg\n  items: [dpkg, rpm]\n" + EXC_RULE + "  exceptions:\n"
        "    - name: by_proc\n      fields: proc.name\n      values: [apt, pkg]\n"
        "    - name: pair\n      fields: [proc.name, fd.name]\n      comps: [=, in]\n"
        "      values:\n        - [cp, [/bin/a, /bin/b]]\n"
        "    - name: listed\n      fields: [proc.name]\n      comps: [in]\n"
        "      values:\n        - [pkg]\n"
    )
    base = {"evt.type": "open", "fd.directory": "/bin", "fd.name": "/bin/a"}
    assert eng.evaluate({**base, "proc.name": "vim"})
    for name in ("apt", "dpkg", "rpm"):
        assert not eng.evaluate({**base, "proc.name": name}), name
    assert not eng.evaluate({**base, "proc.name": "cp"})
    assert eng.evaluate({**base, "proc.name": "cp", "fd.name": "/bin/c"})


def test_exception_validation_errors() -> None:
    with pytest.raises(RuleLoadError, match="comps must be one of"):
        load(
            EXC_RULE + "  exceptions:\n    - name: e\n      fields: proc.name\n"
            "      comps: '='\n      values: [a]\n"
        )
    with pytest.raises(RuleLoadError, match="equal length"):
        load(
            EXC_RULE + "  exceptions:\n    - name: e\n      fields: [proc.name, fd.name]\n"
            "      values: [[a]]\n"
        )
    with pytest.raises(RuleLoadError, match="not a supported comparison operator"):
        load(
            EXC_RULE + "  exceptions:\n    - name: e\n      fields: [proc.name]\n"
            "      comps: [like]\n      values: [[a]]\n"
        )
    duplicate = load(
        EXC_RULE + "  exceptions:\n    - name: e\n      fields: proc.name\n"
        "    - name: e\n      fields: proc.name\n"
    )
    # Falco only warns about a repeated exception name.
    assert [w.code for w in duplicate.warnings] == ["LOAD_EXCEPTION_NAME_NOT_UNIQUE"]


def test_exception_with_unknown_field_names_rule() -> None:
    with pytest.raises(UnknownFieldError, match=r"rule 'Write bin'.*k8s\.pod\.name"):
        ruleset(
            EXC_RULE + "  exceptions:\n    - name: e\n      fields: k8s.pod.name\n"
            "      values: [a]\n"
        )


def test_append_exception_values_via_override() -> None:
    eng = engine(
        EXC_RULE + "  exceptions:\n    - name: e\n      fields: proc.name\n      values: [apt]\n",
        "- rule: Write bin\n  exceptions:\n    - name: e\n      values: [yum]\n"
        "    - name: new\n      fields: [fd.name]\n      values: [[/bin/ok]]\n"
        "  override:\n    exceptions: append\n",
    )
    base = {"evt.type": "open", "fd.directory": "/bin", "fd.name": "/bin/x"}
    assert not eng.evaluate({**base, "proc.name": "apt"})
    assert not eng.evaluate({**base, "proc.name": "yum"})
    assert not eng.evaluate({**base, "proc.name": "vim", "fd.name": "/bin/ok"})
    assert eng.evaluate({**base, "proc.name": "vim"})


def test_cannot_append_fields_to_existing_exception() -> None:
    with pytest.raises(RuleLoadError, match="only values"):
        load(
            EXC_RULE + "  exceptions:\n    - name: e\n      fields: proc.name\n      values: [a]\n",
            "- rule: Write bin\n  exceptions:\n    - name: e\n      fields: fd.name\n"
            "      values: [b]\n  override:\n    exceptions: append\n",
        )


# --- overrides ------------------------------------------------------------------


def test_override_append_condition_output_desc_tags() -> None:
    res = load(
        BASE,
        "- rule: Shell\n  condition: and proc.pname != sshd\n  output: (more)\n"
        "  desc: extra\n  tags: [c, a]\n"
        "  override:\n    condition: append\n    output: append\n    desc: append\n"
        "    tags: append\n",
    )
    r = res.rules["Shell"]
    assert r.condition == "spawned and proc.name in (shells) and proc.pname != sshd"
    assert r.output == "shell %proc.name (more)"
    assert r.desc == "a shell extra"
    assert r.tags == ["b", "a", "c"]


def test_override_replace_everything() -> None:
    res = load(
        BASE,
        "- rule: Shell\n  condition: proc.name = zsh\n  output: new\n  desc: nd\n"
        "  priority: CRITICAL\n  tags: [t]\n  enabled: false\n"
        "  override:\n    condition: replace\n    output: replace\n    desc: replace\n"
        "    priority: replace\n    tags: replace\n    enabled: replace\n",
    )
    r = res.rules["Shell"]
    assert (r.condition, r.output, r.desc, r.priority, r.tags, r.enabled) == (
        "proc.name = zsh",
        "new",
        "nd",
        Priority.CRITICAL,
        ["t"],
        False,
    )


def test_override_list_and_macro() -> None:
    eng = engine(
        BASE,
        "- list: shells\n  items: [zsh]\n  override:\n    items: append\n"
        "- macro: spawned\n  condition: or evt.type = execveat\n"
        "  override:\n    condition: append\n",
    )
    assert eng.evaluate({"evt.type": "execveat", "proc.name": "zsh"})
    eng2 = engine(BASE, "- list: shells\n  items: [zsh]\n  override:\n    items: replace\n")
    assert not eng2.evaluate({"evt.type": "execve", "proc.name": "bash"})
    assert eng2.evaluate({"evt.type": "execve", "proc.name": "zsh"})


def test_legacy_append() -> None:
    res = load(
        BASE,
        "- list: shells\n  items: [zsh]\n  append: true\n"
        "- rule: Shell\n  condition: and user.name = root\n  append: true\n",
    )
    assert res.lists["shells"].items == ["bash", "sh", "zsh"]
    assert res.rules["Shell"].condition.endswith(" and user.name = root")
    assert any("deprecated" in str(w) for w in res.warnings)


def test_override_errors() -> None:
    with pytest.raises(RuleLoadError, match="no earlier definition"):
        load("- rule: Nope\n  condition: x\n  override:\n    condition: append\n")
    with pytest.raises(RuleLoadError, match="cannot be overridden with append"):
        load(BASE, "- rule: Shell\n  priority: INFO\n  override:\n    priority: append\n")
    with pytest.raises(RuleLoadError, match="not defined"):
        load(BASE, "- rule: Shell\n  override:\n    condition: append\n")
    with pytest.raises(RuleLoadError, match="unexpected key 'output'"):
        load(
            BASE, "- rule: Shell\n  condition: x\n  output: y\n  override:\n    condition: append\n"
        )
    with pytest.raises(RuleLoadError, match="list appended to"):
        load("- list: nope\n  items: [a]\n  append: true\n")
    with pytest.raises(RuleLoadError, match="cannot be used together"):
        load(BASE, "- list: shells\n  items: [a]\n  append: true\n  override:\n    items: append\n")


def test_enabled_toggle_and_disabled_rules() -> None:
    rs = ruleset(BASE, "- rule: Shell\n  enabled: false\n")
    entry = rs.get("Shell")
    assert entry is not None and entry.status is RuleStatus.DISABLED
    assert rs.active == []
    with pytest.raises(RuleLoadError, match="no earlier rule"):
        load("- rule: Ghost\n  enabled: false\n")


def test_disabled_rule_is_compiled_like_falco() -> None:
    # Falco compiles disabled rules too (they can be enabled at run time).
    with pytest.raises(UnknownFieldError, match=r"k8s\.pod\.name"):
        ruleset(rule("r", "k8s.pod.name = x") + "  enabled: false\n")
    entry = ruleset(rule("r", "proc.name = x") + "  enabled: false\n").get("r")
    assert entry is not None and entry.status is RuleStatus.DISABLED


def test_redefinition_keeps_position_and_later_files_win(tmp_path: Path) -> None:
    a = tmp_path / "a.yaml"
    b = tmp_path / "b.yaml"
    a.write_text(rule("One", "proc.name = a") + rule("Two", "proc.name = b"))
    b.write_text(rule("One", "proc.name = c", priority="ERROR"))
    res = load_files([a, b])
    assert list(res.rules) == ["One", "Two"]
    assert res.rules["One"].condition == "proc.name = c"
    assert res.rules["One"].ctx.file == str(b)
    assert res.files == [str(a), str(b)]


def test_missing_file_is_a_load_error(tmp_path: Path) -> None:
    with pytest.raises(RuleLoadError, match="cannot read file"):
        load_files([tmp_path / "absent.yaml"])
