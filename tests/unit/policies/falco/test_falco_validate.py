"""validate_files: per-rule status and file-level load errors, never raising."""

from __future__ import annotations

from pathlib import Path

from falco_testkit import registry, rule

from policies.falco.engine import RuleStatus
from policies.falco.validate import validate_files


def test_statuses_and_reasons(tmp_path: Path) -> None:
    f = tmp_path / "r.yaml"
    f.write_text(
        rule("Good", "evt.type = execve and proc.name = sh")
        + rule("Needs k8s", "evt.type = execve and k8s.pod.name = x")
        + rule("Off", "evt.type = execve")
        + "  enabled: false\n"
        + rule("Audit", "ka.verb = get")
        + "  source: k8s_audit\n"
        + rule("Broken", "evt.type = execve and undefined_macro")
    )
    report = validate_files([f], registry())
    by = {r.name: r for r in report.rules}
    assert by["Good"].status is RuleStatus.SUPPORTED and by["Good"].event_types == ["execve"]
    assert by["Needs k8s"].status is RuleStatus.UNSUPPORTED
    assert by["Needs k8s"].reason == "unknown field k8s.pod.name"
    assert report.missing_fields() == {"k8s.pod.name": ["Needs k8s"]}
    assert by["Off"].status is RuleStatus.DISABLED
    assert by["Audit"].reason == "unsupported source 'k8s_audit'"
    assert by["Broken"].status is RuleStatus.ERROR
    assert not report.ok and "undefined macro 'undefined_macro'" in report.errors[0]
    assert report.counts() == {"supported": 1, "unsupported": 2, "disabled": 1, "error": 1}
    assert report.to_dict()["counts"]["supported"] == 1


def test_file_level_error_is_reported(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("- rule: [unclosed\n")
    report = validate_files([f], registry())
    assert not report.ok and report.rules == []
    assert str(f) in report.errors[0] and "invalid YAML" in report.errors[0]
