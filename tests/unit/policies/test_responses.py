from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from alert_bodies import CID

from contract.errors import CorralError
from policies.alert import Alert, make_alert
from policies.responses import (
    DEFAULT_RESPONSES,
    Decision,
    ResponsePolicyError,
    load_responses,
    parse_responses,
)


def alert(
    rule: str = "Some rule",
    priority: str = "Warning",
    tags: list[str] | None = None,
    **fields: Any,
) -> Alert:
    return make_alert(
        rule=rule,
        priority=priority,
        output="o",
        output_fields={"container.id": CID, **fields},
        tags=tags or [],
    )


# --- matching ----------------------------------------------------------------


def test_first_match_wins() -> None:
    policy = parse_responses(
        """
- name: notify all
  actions: [notify]
- name: kill all
  actions: [kill]
"""
    )
    d = policy.decide(alert())
    assert d == Decision(action="notify", rule="Some rule", response=["notify all"])


def test_continue_then_strongest_wins() -> None:
    policy = parse_responses(
        """
- name: notify all
  actions: [notify]
  continue: true
- name: quarantine errors
  match: {priority: ">=Error"}
  actions:
    - action: quarantine
      parameters: {timeout_s: 30}
  continue: true
- name: notify again
  actions: [notify]
"""
    )
    d = policy.decide(alert(priority="Error"))
    assert d.action == "quarantine"
    assert d.parameters == {"timeout_s": 30}
    assert d.response == ["notify all", "quarantine errors", "notify again"]
    assert policy.decide(alert(priority="Warning")).response == ["notify all", "notify again"]


def test_no_match_is_none() -> None:
    policy = parse_responses("- name: crit\n  match: {priority: Critical}\n  actions: [kill]\n")
    assert policy.decide(alert(priority="Warning")) == Decision(action="none", rule="Some rule")
    assert policy.decide(alert(priority="Critical")).action == "kill"
    assert policy.decide(alert(priority="Emergency")).action == "none"  # bare name means "="


@pytest.mark.parametrize(
    ("test", "priority", "hit"),
    [
        (">=Critical", "Emergency", True),
        (">=Critical", "Critical", True),
        (">=Critical", "Error", False),
        (">Critical", "Critical", False),
        ("<Warning", "Notice", True),
        ("<=Warning", "Error", False),
        ("!=Debug", "Debug", False),
        ("==informational", "Informational", True),
        ("= Notice", "Notice", True),
    ],
)
def test_priority_comparisons(test: str, priority: str, hit: bool) -> None:
    policy = parse_responses(f'- name: r\n  match: {{priority: "{test}"}}\n  actions: [kill]\n')
    assert (policy.decide(alert(priority=priority)).action == "kill") is hit


def test_rule_names_and_globs() -> None:
    policy = parse_responses(
        """
- name: r
  match:
    rules: ["Exact rule", "Write below *"]
  actions: [kill]
"""
    )
    assert policy.decide(alert(rule="Exact rule")).action == "kill"
    assert policy.decide(alert(rule="Write below binary dir in sandbox")).action == "kill"
    assert policy.decide(alert(rule="Exact rule 2")).action == "none"


def test_tags_any_entry_all_within() -> None:
    policy = parse_responses(
        """
- name: r
  match:
    tags: ["corral, mitre_execution", "crypto"]
  actions: [kill]
"""
    )
    assert policy.decide(alert(tags=["corral", "mitre_execution", "x"])).action == "kill"
    assert policy.decide(alert(tags=["crypto"])).action == "kill"
    assert policy.decide(alert(tags=["corral"])).action == "none"
    assert policy.decide(alert(tags=[])).action == "none"


def test_output_fields() -> None:
    policy = parse_responses(
        """
- name: r
  match:
    output_fields:
      - "proc.name=xmrig, fd.sport!=3333"
      - "proc.pid=7"
  actions: [kill]
"""
    )
    assert policy.decide(alert(**{"proc.name": "xmrig", "fd.sport": 80})).action == "kill"
    assert policy.decide(alert(**{"proc.name": "xmrig", "fd.sport": 3333})).action == "none"
    assert policy.decide(alert(**{"proc.name": "xmrig"})).action == "kill"  # absent != 3333
    assert policy.decide(alert(**{"proc.pid": 7})).action == "kill"  # ints compare as text
    assert policy.decide(alert(**{"proc.name": "sh"})).action == "none"


def test_source() -> None:
    policy = parse_responses("- name: r\n  match: {source: k8s_audit}\n  actions: [kill]\n")
    assert policy.decide(alert()).action == "none"


def test_dry_run_turns_into_recorded_notify() -> None:
    policy = parse_responses(
        """
- name: trial kill
  match: {rules: [New rule]}
  actions: [kill]
  dry_run: true
"""
    )
    d = policy.decide(alert(rule="New rule"))
    assert d.action == "notify"
    assert d.dry_run is True
    assert d.parameters == {"dry_run_action": "kill"}
    assert d.response == ["trial kill"]


def test_dry_run_beside_a_real_action() -> None:
    policy = parse_responses(
        """
- name: trial quarantine
  actions: [{action: quarantine, parameters: {timeout_s: 5}}]
  dry_run: true
  continue: true
- name: real kill
  match: {priority: ">=Critical"}
  actions: [kill]
"""
    )
    crit = policy.decide(alert(priority="Critical"))
    assert (crit.action, crit.dry_run) == ("kill", False)  # nothing was softened
    warn = policy.decide(alert(priority="Warning"))
    assert (warn.action, warn.dry_run) == ("notify", True)
    assert warn.parameters == {"timeout_s": 5, "dry_run_action": "quarantine"}


def test_quarantine_default_timeout() -> None:
    policy = parse_responses("- name: q\n  actions: [quarantine]\n")
    assert policy.decide(alert()).parameters == {"timeout_s": 600}


def test_decision_json_shape() -> None:
    d = parse_responses("- name: q\n  actions: [kill]\n").decide(alert())
    assert d.model_dump(mode="json") == {
        "action": "kill",
        "rule": "Some rule",
        "response": ["q"],
        "dry_run": False,
        "parameters": {},
    }


# --- loading errors ----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- name: r\n  actions: [explode]\n", "rule 'r': unknown action 'explode' (one of kill"),
        ("- name: r\n  actions: [{action: stop}]\n", "rule 'r': unknown action 'stop'"),
        (
            "- name: r\n  match: {priority: '>>Critical'}\n  actions: [kill]\n",
            "rule 'r': match.priority: bad priority comparison '>>Critical'",
        ),
        (
            "- name: r\n  match: {priority: '>=Severe'}\n  actions: [kill]\n",
            "rule 'r': match.priority: unknown priority 'Severe'",
        ),
        ("- name: r\n  matches: {}\n  actions: [kill]\n", "rule 'r': unknown key 'matches'"),
        ("- name: r\n  actons: [kill]\n", "rule 'r': unknown key 'actons'"),
        (
            "- name: r\n  match: {priorty: Error}\n  actions: [kill]\n",
            "rule 'r': unknown key 'match.priorty'",
        ),
        ("- name: r\n  actions: []\n", "rule 'r': actions:"),
        ("- name: r\n", "rule 'r': missing key 'actions'"),
        ("- actions: [kill]\n", "rule #1: missing key 'name'"),
        (
            "- name: r\n  actions: [{action: kill, parameters: {timeout_s: 1}}]\n",
            "action kill has unknown parameter(s) timeout_s",
        ),
        (
            "- name: r\n  actions: [{action: quarantine, parameters: {timeout_s: -1}}]\n",
            "timeout_s must be a positive number",
        ),
        (
            "- name: r\n  match: {output_fields: [proc.name]}\n  actions: [kill]\n",
            "bad output_fields test 'proc.name'",
        ),
        (
            "- name: r\n  actions: [kill]\n- name: r\n  actions: [notify]\n",
            "rule 'r': defined twice",
        ),
        ("name: r\n", "must be a YAML list of response rules, got dict"),
        ("- just a string\n", "rule #1: must be a mapping, got str"),
        ("- name: [unclosed\n", "not valid YAML"),
    ],
)
def test_bad_files(text: str, message: str) -> None:
    with pytest.raises(ResponsePolicyError) as info:
        parse_responses(text, source="resp.yaml")
    msg = str(info.value)
    assert msg.startswith("resp.yaml:")
    assert message in msg
    assert "\n" not in msg
    assert isinstance(info.value, CorralError)


def test_load_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text("- name: r\n  actions: [nuke]\n")
    with pytest.raises(ResponsePolicyError, match=r"r\.yaml: rule 'r': unknown action 'nuke'"):
        load_responses(path)
    with pytest.raises(ResponsePolicyError, match="cannot read"):
        load_responses(tmp_path / "missing.yaml")


def test_empty_file_is_empty_policy(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text("# nothing yet\n")
    assert load_responses(path).decide(alert()).action == "none"


# --- the shipped defaults ------------------------------------------------------


@pytest.mark.parametrize(
    ("rule", "priority", "tags", "action"),
    [
        ("Crypto miner in sandbox", "Critical", ["corral"], "kill"),
        ("Anything", "Emergency", [], "kill"),
        ("Write below binary dir in sandbox", "Error", ["corral", "corral_tamper"], "quarantine"),
        ("Write below binary dir", "Warning", [], "quarantine"),  # upstream name
        ("Tamper at warning", "Warning", ["corral_tamper"], "quarantine"),
        ("Tamper at critical", "Critical", ["corral_tamper"], "kill"),
        ("Read credentials in sandbox", "Error", ["corral"], "quarantine"),
        ("Read sensitive file in sandbox", "Warning", ["corral"], "notify"),
        ("Write below etc in sandbox", "Notice", ["corral"], "notify"),
        ("Chatty", "Informational", [], "none"),
        ("Chatty", "Debug", [], "none"),
    ],
)
def test_default_responses(rule: str, priority: str, tags: list[str], action: str) -> None:
    d = load_responses(DEFAULT_RESPONSES).decide(alert(rule=rule, priority=priority, tags=tags))
    assert d.action == action
    if action == "quarantine":
        assert d.parameters["timeout_s"] == 600
