from __future__ import annotations

from pathlib import Path

import pytest

from policies.alert import make_alert
from policies.testcases import PolicyTestError, compare, load_test_cases

SHIPPED = Path(__file__).resolve().parents[3] / "policies" / "tests"
RULES = Path(__file__).resolve().parents[3] / "policies" / "rules" / "corral_rules.yaml"


def test_shipped_cases_load_and_name_real_rules() -> None:
    import yaml

    cases = load_test_cases(SHIPPED)
    names = {c.name for c in cases}
    assert {
        "write below /bin triggers",
        "reading /etc/shadow triggers",
        "echo hi triggers nothing",
    } <= names
    rule_names = {i["rule"] for i in yaml.safe_load(RULES.read_text()) if "rule" in i}
    for case in cases:
        assert set(case.expect.alerts) <= rule_names, case.name
        assert case.image == "busybox"
    echo = next(c for c in cases if c.name == "echo hi triggers nothing")
    assert echo.commands == ["echo hi"] and echo.expect.alerts == []


def test_compare() -> None:
    ok = compare(["A"], ["A", "A"])
    assert ok.passed and ok.got == ["A"]
    bad = compare(["A", "B"], ["B", "C"], name="n")
    assert not bad.passed
    assert (bad.missing, bad.unexpected) == (["A"], ["C"])
    assert bad.summary() == "FAIL n: missing A; unexpected C"
    assert compare([], []).passed
    assert not compare([], ["X"]).passed


def test_compare_takes_alerts() -> None:
    alert = make_alert(
        rule="A", priority="Error", output="o", output_fields={"container.id": "a" * 12}
    )
    assert compare(["A"], [alert]).passed


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "case.yaml").write_text(text)
    return tmp_path


def test_single_mapping_file(tmp_path: Path) -> None:
    (case,) = load_test_cases(write(tmp_path, "name: x\ncommands: [echo]\nexpect: {alerts: []}\n"))
    assert case.name == "x" and case.file.endswith("case.yaml")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: x\ncommands: [echo]\n", "case 'x': missing key 'expect'"),
        ("name: x\ncommands: []\nexpect: {alerts: []}\n", "case 'x': commands:"),
        ("name: x\ncommand: [echo]\nexpect: {alerts: []}\n", "unknown key 'command'"),
        ("name: x\ncommands: [echo]\nexpect: {alert: []}\n", "unknown key 'expect.alert'"),
        ("- name: x\n  commands: [a]\n  expect: {alerts: []}\n" * 2, "name already used"),
        ("- oops\n", "case #1: must be a mapping"),
        ("name: [\n", "cannot read"),
    ],
)
def test_bad_cases(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(PolicyTestError) as info:
        load_test_cases(write(tmp_path, text))
    assert message in str(info.value)
    assert "case.yaml" in str(info.value)


def test_empty_dir(tmp_path: Path) -> None:
    with pytest.raises(PolicyTestError, match="no"):
        load_test_cases(tmp_path)
    with pytest.raises(PolicyTestError, match="not a directory"):
        load_test_cases(tmp_path / "nope")
