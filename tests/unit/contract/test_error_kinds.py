"""Error kinds cross Temporal by name; what each means is data in contract.errors."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from temporalio.exceptions import ApplicationError

import contract.errors as errors
from activities.glue import to_app_error
from activities.step_exec import CONTAINERD_DOWN
from contract.errors import (
    ERROR_KINDS,
    ContainerdError,
    ContainerdUnavailable,
    FileNotFound,
    InvalidSpec,
    NetworkError,
    SandboxError,
    SandboxStartFailed,
    kinds_where,
)
from corral.errors import EpisodeEnded
from corral.sdk import _CALLS_GONE, _ERROR_TYPES, _HANDED_OVER, _REFUSALS, _update_error
from workflows.steps import INTERRUPTING, NON_RETRYABLE

REPO = Path(__file__).resolve().parents[3]


def test_the_retry_policy_lists_the_kinds_no_retry_fixes_in_the_recorded_order() -> None:
    # The list is part of every ScheduleActivityTask command in the recorded histories.
    assert NON_RETRYABLE == [
        "InvalidSpec",
        "ImageNotFound",
        "ImagePullFailed",
        "InvalidReference",
        "SandboxPaused",
        "SandboxNotFound",
    ]
    assert {"ContainerdUnavailable", "ContainerdError", "SandboxNotFound"} == INTERRUPTING


def _raised_types() -> set[tuple[str, str]]:
    """Every literal `type="..."` given to an ApplicationError below the face."""
    found: set[tuple[str, str]] = set()
    for folder in ("workflows", "activities", "workers", "sandbox", "policies"):
        for path in (REPO / folder).rglob("*.py"):
            if "_gen" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if not (
                    isinstance(node, ast.Call)
                    and getattr(node.func, "id", "") == "ApplicationError"
                ):
                    continue
                for keyword in node.keywords:
                    if keyword.arg == "type" and isinstance(keyword.value, ast.Constant):
                        found.add((str(path.relative_to(REPO)), str(keyword.value.value)))
    return found


def test_every_error_type_raised_across_temporal_has_a_kind_or_is_a_sandbox_error() -> None:
    classes = {name for name, obj in inspect.getmembers(errors, inspect.isclass)}
    raised = _raised_types()
    assert raised, "the scan found no ApplicationError at all"
    unknown = sorted(
        f"{path}: {name}"
        for path, name in raised
        if name not in ERROR_KINDS | dict.fromkeys(classes)
    )
    assert not unknown, f"add these to contract.errors.ERROR_KINDS: {unknown}"


def test_the_sdk_reads_the_episode_endings_and_refusals_from_the_table() -> None:
    assert set(_ERROR_TYPES) <= set(kinds_where(lambda kind: kind.ends_episode))
    assert {"ValueError", "EpisodeFinishing", "InvalidRequest", "EpisodeRejected"} <= _REFUSALS
    assert not {"CallsOnNode", "CallsClosed"} & _REFUSALS  # those are sent again, not refused


def test_an_ended_episode_is_read_from_the_details_not_the_message() -> None:
    cause = ApplicationError(
        "a message worded some other way",
        {"outcome": "killed", "reason": "on-call: x"},
        type="EpisodeEnded",
    )
    err = _update_error("ep-1", "exec", cause)
    assert isinstance(err, EpisodeEnded)
    assert (err.outcome, err.reason) == ("killed", "on-call: x")


def test_the_node_retries_the_sandbox_errors_the_table_calls_retryable_and_no_other() -> None:
    for retried in (ContainerdUnavailable("x"), ContainerdError("x"), SandboxStartFailed("x")):
        assert not to_app_error(retried).non_retryable, type(retried).__name__
    for refused in (InvalidSpec("x"), FileNotFound("x"), SandboxError("x"), NetworkError("x")):
        error = to_app_error(refused)
        assert error.non_retryable and error.type == type(refused).__name__
    assert set(CONTAINERD_DOWN) == {"ContainerdUnavailable", "ContainerdError"}


def test_the_sdk_sends_a_handed_over_call_to_the_other_workflow() -> None:
    assert {"CallsOnNode", "CallsClosed"} == _HANDED_OVER
    assert _HANDED_OVER <= _CALLS_GONE
