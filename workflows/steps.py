"""What the episode and its calls workflow share about running work on a node:
which failures no retry fixes, which mean a step was lost, the retry policy,
and how an activity failure reaches the trainer. Deterministic, no I/O."""

from __future__ import annotations

from collections.abc import Awaitable
from datetime import timedelta
from typing import TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.step_exec import interrupted_step
    from contract.errors import kinds_where
    from contract.models import ExecStepInput, StepResult

T = TypeVar("T")

# Errors that no retry can fix: fail the provision at once.
NON_RETRYABLE = list(kinds_where(lambda kind: not kind.retryable))
# Activity failures that mean the step was lost with its sandbox, containerd or
# node (not a bad request): the step is reported interrupted with the cause.
INTERRUPTING = frozenset(kinds_where(lambda kind: kind.lost_step))


def node_retry_policy(attempts: int) -> RetryPolicy:
    return RetryPolicy(
        maximum_attempts=attempts,
        initial_interval=timedelta(milliseconds=200),
        # Provisions ride out a containerd restart (about 30 s of retries).
        maximum_interval=timedelta(seconds=8),
        non_retryable_error_types=NON_RETRYABLE,
    )


def application_cause(err: ActivityError | ApplicationError) -> ApplicationError | None:
    """The innermost application error: what actually went wrong. (A local
    activity's failure reaches the workflow as the application error itself,
    not wrapped in an `ActivityError`.)"""
    cause: BaseException | None = err.cause if isinstance(err, ActivityError) else err
    while cause is not None and not isinstance(cause, ApplicationError):
        cause = getattr(cause, "cause", None)
    return cause if isinstance(cause, ApplicationError) else None


def cause_message(err: ActivityError) -> str:
    cause = application_cause(err)
    return str(cause.message) if cause is not None else str(err)


def lost_step(request: ExecStepInput, err: ActivityError | ApplicationError) -> StepResult:
    """The step a failed exec activity stands for: `interrupted` with its cause
    when the sandbox, containerd or node went under it; a bad request re-raises."""
    cause = application_cause(err)
    if cause is not None and cause.type not in INTERRUPTING:
        raise err
    return interrupted_step(request, str(cause.message) if cause else str(err))


async def surfaced(work: Awaitable[T]) -> T:
    """An activity failure inside an Update reaches the trainer as its cause
    (type and one-line message), not as "Activity task failed"."""
    try:
        return await work
    except (ActivityError, ApplicationError) as err:
        cause = application_cause(err)
        if cause is None:
            raise ApplicationError(str(err), type="RequestFailed") from None
        raise ApplicationError(
            str(cause.message), *cause.details, type=cause.type or "RequestFailed"
        ) from None
