"""The episode's constants and pure helpers: limits, patch ids, the sandbox id,
how a failed step or error reads. No workflow state here; every part of
`EpisodeWorkflow` (workflows/episode*.py) may import this module.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Sequence
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError, is_cancelled_exception

with workflow.unsafe.imports_passed_through():
    from contract.models import FileSpec, StepResult, WriteFileRequest
    from workflows.models import KillOrder

# States written to the EpisodeState search attribute (the SDK starts episodes
# as "provisioning"); passing states like "placing" only show in the details.
VISIBLE_STATES = frozenset(
    {
        "waiting",
        "running",
        "hibernated",
        "quarantined",
        "completed",
        "failed",
        "killed",
        "timed_out",
        "cancelled",
    }
)
# Continue-as-new well before Temporal's 50k-event / 50 MB history limits.
MAX_STEPS_PER_RUN = 400
# The lean path (one node activity per scripted episode) takes scripts this short
# whose outputs fit one payload (Temporal's limit is 2 MB).
LEAN_MAX_STEPS = 50
LEAN_MAX_OUTPUT_BYTES = 1024 * 1024
# Provisions retry this often (0.2 s doubling to 8 s between attempts: about
# 30 s in all), enough to ride out a containerd restart.
PROVISION_ATTEMPTS = 8
# While no node has room, ask placement again this often.
PLACE_RETRY_S = 2.0
# Patch id: the idle timer is armed once per idle period, not reset per request.
IDLE_TIMER_REARMED = "idle-timer-rearmed"
# Patch id: a quarantine whose alert came in as the body ended is still carried
# out (the watermark makes a step's alerts arrive before its result).
QUARANTINE_AFTER_BODY = "quarantine-after-body"
# Patch id: an alert that arrives during the teardown still decides the outcome.
LATE_ALERTS = "late-alerts"
# Patch id: a node that answers NodeFull is asked again later, not excluded.
NODE_FULL_WAITS = "node-full-waits"
# Patch id: an interactive episode's calls run on its node (workflows/calls.py).
CALLS_ON_NODE = "calls-on-node"
# Patch id: a lean run whose node is lost is placed again when its steps are idempotent.
LEAN_PLACED_AGAIN = "lean-placed-again"
# A quarantine or release that met the calls workflow's start is passed on after it.
CALLS_HOLD_AFTER_START = "calls-hold-after-start"
# After the episode ends, wait this long for its calls workflow's step log.
CALLS_LOG_WAIT_S = 30.0


class Killed(Exception):
    """Raised inside the workflow to end the episode now (rule, on-call or timer)."""

    def __init__(self, order: KillOrder) -> None:
        super().__init__(order.reason)
        self.order = order


async def settle(task: asyncio.Task[Any]) -> None:
    """Wait for a cancelled task to unwind, swallowing its cancellation."""
    try:
        await task
    except BaseException as err:
        if not (isinstance(err, asyncio.CancelledError) or is_cancelled_exception(err)):
            workflow.logger.info("episode body ended with %r after kill", err)


def sensor_verdict(verdicts: Sequence[StepResult | str]) -> str:
    """The episode's watermark: the first step (or teardown) not judged in time,
    else ok ("" when nothing asked the sensor, e.g. histories from before it)."""
    said = [v if isinstance(v, str) else v.sensor for v in verdicts]
    said = [v for v in said if v]
    bad = [v for v in said if v not in ("ok", "off")]
    if bad:
        return bad[0]
    return "ok" if "ok" in said else (said[0] if said else "")


def step_failed(result: StepResult) -> ApplicationError:
    return ApplicationError(
        f"step {result.index} `{result.cmd}` " + step_failure(result),
        type="StepFailed",
        non_retryable=True,
    )


def file_request(spec_file: FileSpec) -> WriteFileRequest:
    return WriteFileRequest(
        path=spec_file.path,
        content_b64=base64.b64encode(spec_file.content.encode()).decode(),
        mode=spec_file.mode,
    )


def step_failure(result: StepResult) -> str:
    if result.interrupted:
        return f"interrupted: {result.interrupted}"
    return "timed out" if result.timed_out else f"exited {result.exit_code}"


def outcome_of(err: ApplicationError) -> str:
    return {"IdleTimeout": "timed_out"}.get(err.type or "", "failed")
