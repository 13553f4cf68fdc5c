"""Tools for policy authors (`corral policy validate|explain|test`): Falco rules
and response files checked, one rule explained, rule test cases run."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from contract.config import StackConfig
from policies.falco.engine import Ruleset
from policies.falco.explain import Explanation
from policies.falco.explain import explain_rule as _explain
from policies.falco.fields import default_registry
from policies.falco.loader import load_files
from policies.falco.validate import ValidationReport, validate_files
from policies.responses import load_responses
from policies.runner import run_cases
from policies.testcases import CaseResult

__all__ = [
    "CaseResult",
    "Explanation",
    "ValidationReport",
    "explain_rule",
    "rule_paths",
    "run_rule_tests",
    "validate_rules",
]


def rule_paths(config: StackConfig, files: Sequence[Path] = ()) -> list[Path]:
    """`files` in order, or, when none are given, the stack's rule files (`sensor.rules`)."""
    return list(files) or [config.resolve(p) for p in config.sensor.rules]


def validate_rules(
    paths: Sequence[Path],
    *,
    responses: Path | None = None,
    allow_unsupported: bool = False,
) -> ValidationReport:
    """Load the rule files in order, compile leniently and report each rule's
    support by the built-in sensor; with `responses`, a responses file that does
    not load is one more error. `report.ok` is False on what Falco refuses and on
    rules this engine cannot evaluate (unless `allow_unsupported`)."""
    report = validate_files(paths, default_registry(), allow_unsupported=allow_unsupported)
    if responses is not None:
        try:
            load_responses(responses)
        except Exception as err:
            report.errors.append(" ".join(str(err).split()))
    return report


def explain_rule(rule: str, paths: Sequence[Path]) -> Explanation:
    """Rule `rule` of the files `paths`: its expanded condition, fields, event types,
    macros, lists and exceptions. Raises `CorralError` when the files do not load
    or name no such rule."""
    ruleset = Ruleset.build(load_files(paths), default_registry(), strict=False)
    return _explain(ruleset, rule)


async def run_rule_tests(
    config: StackConfig,
    directory: Path,
    paths: Sequence[Path],
    *,
    say: Callable[[str], None] | None = None,
) -> list[CaseResult]:
    """Run the YAML test cases in `directory` against the rules `paths`, in real
    sandboxes with the real sensor (the stack's containerd must be up); one result
    per case. `say` is told what runs."""
    return await run_cases(config, directory, paths, say=say or (lambda _msg: None))
