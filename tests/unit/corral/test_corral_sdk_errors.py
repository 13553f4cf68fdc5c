"""How the SDK names what went wrong (no services: Temporal's failures built by hand)."""

from __future__ import annotations

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import (
    ApplicationError,
    CancelledError,
    TimeoutType,
)
from temporalio.exceptions import TimeoutError as TemporalTimeoutError
from temporalio.service import RPCError, RPCStatusCode

from corral import CorralError, EpisodeSpec, Step
from corral.errors import (
    CorralRPCError,
    EpisodeCancelled,
    EpisodeEnded,
    EpisodeFileNotFound,
    EpisodeNotFound,
    EpisodeQuarantined,
    EpisodeRejected,
    EpisodeRequestFailed,
    EpisodeRequestTimedOut,
    EpisodeTimedOut,
    EpisodeWaitTimedOut,
)
from corral.sdk import _episode_error, _innermost, _rpc_error, _update_error


def test_no_steps_means_interactive_unless_the_spec_says_otherwise() -> None:
    assert EpisodeSpec(image="busybox").interactive is True
    assert EpisodeSpec(image="busybox", steps=[Step(cmd="true")]).interactive is False
    assert EpisodeSpec(image="busybox", interactive=False).interactive is False
    assert (
        EpisodeSpec(image="busybox", steps=[Step(cmd="true")], interactive=True).interactive is True
    )


def test_a_missing_file_is_named_and_is_also_a_file_not_found_error() -> None:
    cause = ApplicationError("no file '/nope' in sandbox 'ab12'", type="FileNotFound")
    err = _update_error("ep-1", "read_file", cause)
    assert isinstance(err, EpisodeFileNotFound) and isinstance(err, FileNotFoundError)
    assert str(err) == "no file '/nope' in sandbox 'ab12'"


def test_a_sandbox_error_keeps_its_type_and_message() -> None:
    cause = ApplicationError("sandbox 'ab12' is paused", type="SandboxPaused")
    err = _update_error("ep-1", "exec", cause)
    assert type(err) is EpisodeRequestFailed
    assert err.error_type == "SandboxPaused" and "paused" in str(err)


def test_the_activity_cause_is_found_under_the_update_failure() -> None:
    inner = ApplicationError("no file '/x' in sandbox 's'", type="FileNotFound")
    outer = ApplicationError("Activity task failed")
    outer.__cause__ = inner  # temporalio chains failures through `cause`
    assert _innermost(outer) is inner


def test_an_ended_episode_names_how_and_why() -> None:
    cause = ApplicationError(  # as workflows/episode*.py raises it: how and why in details
        "episode ep-1 has ended: killed: rule Shell in sandbox",
        {"outcome": "killed", "reason": "rule Shell in sandbox"},
        type="EpisodeEnded",
    )
    err = _update_error("ep-1", "exec", cause)
    assert isinstance(err, EpisodeEnded) and isinstance(err, EpisodeRejected)
    assert (err.outcome, err.reason) == ("killed", "rule Shell in sandbox")
    assert str(err) == "episode ep-1 has ended: killed: rule Shell in sandbox"


def test_quarantine_and_validator_refusals_are_rejections() -> None:
    quarantined = _update_error("ep-1", "exec", ApplicationError("q", type="EpisodeQuarantined"))
    assert isinstance(quarantined, EpisodeQuarantined)
    refused = _update_error(
        "ep-1", "finish", ApplicationError("not interactive", type="ValueError")
    )
    assert type(refused) is EpisodeRejected and "refused finish: not interactive" in str(refused)


def test_timeouts_are_also_python_timeout_errors() -> None:
    activity_timeout = TemporalTimeoutError(
        "activity timeout", type=TimeoutType.START_TO_CLOSE, last_heartbeat_details=[]
    )
    err = _update_error("ep-1", "exec", activity_timeout)
    assert isinstance(err, EpisodeRequestTimedOut) and isinstance(err, TimeoutError)
    assert issubclass(EpisodeTimedOut, TimeoutError) and issubclass(EpisodeTimedOut, CorralError)
    assert issubclass(EpisodeWaitTimedOut, TimeoutError)


def test_a_cancelled_episode_names_itself() -> None:
    failure = WorkflowFailureError(cause=CancelledError("cancelled"))
    err = _episode_error("ep-7", failure)
    assert isinstance(err, EpisodeCancelled) and str(err) == "episode ep-7 was cancelled"
    assert err.outcome == "cancelled"


@pytest.mark.parametrize(
    ("status", "kind"),
    [(RPCStatusCode.NOT_FOUND, EpisodeNotFound), (RPCStatusCode.UNAVAILABLE, CorralRPCError)],
)
def test_every_rpc_error_is_a_corral_error(status: RPCStatusCode, kind: type) -> None:
    err = _rpc_error("ep-1", RPCError("boom", status, b""))
    assert isinstance(err, kind) and isinstance(err, CorralError)
    assert "ep-1" in str(err)
