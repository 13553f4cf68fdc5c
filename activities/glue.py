"""The Temporal glue every node activity shares.

Awaiting while heartbeating (a dead worker is noticed in seconds), running a
piece of work to its end through a cancellation, turning the sandbox layer's
errors into `ApplicationError`s whose `type` is the error class name (so the
workflow's retry policy can mark the hopeless ones non-retryable), and what
the calling activity is (its attempt, its workflow run). Outside an activity
(tests, bench) each of these still works.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.sensorwatch import SensorDown
from contract.errors import CorralError, SandboxError, kinds_where

T = TypeVar("T")
HEARTBEAT_EVERY_S = 5.0
# The sandbox errors a retry can help (contract/errors.py: containerd down or
# restarting, a start rolled back); the node raises every other one non-retryable.
RETRYABLE_KINDS = kinds_where(lambda kind: kind.retryable)


async def heartbeating(work: Awaitable[T]) -> T:
    """Await `work` while heartbeating, so a dead worker is noticed in seconds."""
    task = asyncio.ensure_future(work)
    while True:
        done, _ = await asyncio.wait({task}, timeout=HEARTBEAT_EVERY_S)
        if done:
            return task.result()
        with contextlib.suppress(RuntimeError):  # outside an activity (tests, bench)
            activity.heartbeat()


async def uncut(work: Awaitable[T]) -> T:
    """Run `work` to its end even if the caller is cancelled meanwhile, then
    re-raise the cancellation. containerd goes on making a sandbox whose call
    was cut off; the teardown that stopped the caller must find all of it."""
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait({task})
        if not task.cancelled():
            task.exception()  # retrieved: its failure matters no more
        raise


async def mapped(work: Awaitable[T]) -> T:
    """`work`'s result; a Corral error comes out as its `ApplicationError`."""
    try:
        return await work
    except CorralError as err:
        raise to_app_error(err) from err


def to_app_error(err: CorralError) -> ApplicationError:
    # A node whose sensor is down: the command waits for it (retries), never runs unwatched.
    retryable = isinstance(err, SensorDown) or (
        isinstance(err, SandboxError) and type(err).__name__ in RETRYABLE_KINDS
    )
    return ApplicationError(str(err), type=type(err).__name__, non_retryable=not retryable)


def app_error(error_type: str, message: str) -> ApplicationError:
    """A non-retryable failure of type `error_type` (NodeFull, EpisodeClosed, ...)."""
    return ApplicationError(message, type=error_type, non_retryable=True)


def first_attempt() -> bool:
    """True in an activity's first attempt; False outside an activity (unknown)."""
    try:
        return activity.info().attempt == 1
    except RuntimeError:
        return False


def workflow_run_id() -> str:
    """The calling episode's run id, or "" outside an activity."""
    try:
        return activity.info().workflow_run_id or ""
    except RuntimeError:
        return ""


def heartbeat(*details: object) -> None:
    """Heartbeat when inside an activity (a no-op outside one)."""
    with contextlib.suppress(RuntimeError):
        activity.heartbeat(*details)
