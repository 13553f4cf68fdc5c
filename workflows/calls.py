"""`EpisodeCallsWorkflow`: an interactive episode's tool calls, on its node.

A call through the episode itself crosses Temporal twice (the Update, then an
activity on the node's queue): two workflow tasks and about eleven history
events. Once an interactive episode is ready, it starts this child on its
node's own task queue, where the node worker runs it; each call is an Update
whose handler runs the node's activity as a *local* activity, in the same
process that holds the sandbox. One workflow task and six events a call
(update accepted, marker, update completed, and the task's three).

Durability is the step journal's (activities/step_exec.py, activities/toolcalls.py):
each exec or spawn is journaled on the node under its index before it runs, so
a call replayed after the node worker died mid-call reports `interrupted`
instead of running twice.

The episode stays the supervisor. It tells this workflow to `hold` while it
is quarantined, `resume` on release and `close` when it finishes or ends; a
call it refuses (held, closed) is refused with the type the SDK maps, and the
SDK sends a call to the episode itself whenever this workflow is not running.
This workflow keeps the idle clock (the episode cannot see these calls) and
returns `idle` when the episode has had no call for its idle timeout; the
episode then hibernates or ends as before. It returns the calls' step log
(as the episode keeps its own: outputs of this run, summaries of runs before a
continue-as-new) and the next step index.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, Field
from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.node import NodeActivities
    from activities.toolcalls import (
        JobInfo,
        JobInput,
        JobOutputResult,
        JobRequest,
        JobState,
        JobStdinInput,
        JobStdinRequest,
        SpawnInput,
        SpawnRequest,
        ToolCallActivities,
        ToolExecInput,
        ToolExecRequest,
    )
    from contract.models import ExecRequest, ExecStepInput, StepResult
    from workflows.steps import lost_step, node_retry_policy, surfaced

# Continue-as-new well before Temporal's history limits (six events a call).
MAX_CALLS_PER_RUN = 2000
CLOSE_SIGNAL, HOLD_SIGNAL, RESUME_SIGNAL = "close", "hold", "resume"


class CallsInput(BaseModel):
    episode_id: str
    sandbox_id: str
    next_index: int
    default_timeout_s: float
    output_limit_bytes: int
    base_env: dict[str, str] = Field(default_factory=dict)
    # No call for this long: return `idle` (the episode's idle TTL, or its
    # hibernation delay when that comes first).
    idle_timeout_s: float
    last_call: datetime | None = None
    # Continue-as-new after this many calls (the episode's `max_steps_per_run`, tests set it low).
    max_calls_per_run: int = Field(default=MAX_CALLS_PER_RUN, ge=1)
    # Carried over continue-as-new: the earlier runs' steps (without output).
    steps: list[StepResult] = Field(default_factory=list)
    held: str = ""


class CallsResult(BaseModel):
    ended: Literal["closed", "idle"]
    next_index: int
    last_call: datetime
    # This run's steps with their output (as the episode keeps its own), earlier runs' without.
    steps: list[StepResult] = Field(default_factory=list)


class CallsProgress(BaseModel):
    """What `status` adds for the calls the episode has not absorbed yet."""

    steps_done: int
    last_call: datetime
    held: str = ""  # why calls are refused now (quarantine), empty while they run


class HoldRequest(BaseModel):
    reason: str = ""


# Not sandboxed: the sandbox runs each payload's serialization context through
# exec'd code (temporalio's workflow_sandbox/_runner.py), which cost more of the
# node worker's CPU per call than the workflow itself. This workflow imports
# nothing with side effects, and its replay test guards its determinism.
@workflow.defn(name="EpisodeCalls", sandboxed=False)
class EpisodeCallsWorkflow:
    @workflow.init
    def __init__(self, input: CallsInput) -> None:
        self._input = input
        self._next_index = input.next_index
        self._steps: list[StepResult] = list(input.steps)
        self._last_call = input.last_call or workflow.now()
        self._held = input.held
        self._closed = False
        self._calls_this_run = 0
        self._running = 0
        # Calls that start processes run in turn, as the episode's do.
        self._lock = asyncio.Lock()

    @workflow.run
    async def run(self, input: CallsInput) -> CallsResult:
        ended = await self._serve()
        await workflow.wait_condition(
            lambda: self._running == 0 and workflow.all_handlers_finished()
        )
        if ended == "continue":
            workflow.continue_as_new(self._carry())
        return CallsResult(
            ended=ended,  # type: ignore[arg-type]
            next_index=self._next_index,
            last_call=self._last_call,
            steps=self._steps,
        )

    async def _serve(self) -> str:
        """Until closed, idle or due to continue-as-new. A call does not wake this
        loop (it only moves `_last_call`): the idle timer is armed once per idle
        period and re-armed for the time left, so a call costs no timer events."""
        while not self._closed:
            if self._held:
                await workflow.wait_condition(lambda: self._closed or not self._held)
                self._last_call = workflow.now()  # idle time starts again on release
                continue
            left_s = self._idle_left_s()
            if left_s <= 0 and self._running == 0:
                return "idle"
            if left_s <= 0:
                await workflow.wait_condition(lambda: self._running == 0)
                continue
            try:
                await workflow.wait_condition(
                    lambda: self._closed or self._continue_due() or bool(self._held),
                    timeout=timedelta(seconds=left_s),
                )
            except TimeoutError:
                continue
            if self._continue_due() and not self._closed:
                return "continue"
        return "closed"

    def _idle_left_s(self) -> float:
        idle_s = (workflow.now() - self._last_call).total_seconds()
        return self._input.idle_timeout_s - idle_s

    def _continue_due(self) -> bool:
        return (
            workflow.info().is_continue_as_new_suggested()
            or self._calls_this_run >= self._input.max_calls_per_run
        )

    def _carry(self) -> CallsInput:
        return self._input.model_copy(
            update={
                "next_index": self._next_index,
                "last_call": self._last_call,
                "steps": [step.summary() for step in self._steps],
                "held": self._held,
            }
        )

    # ------------------------------------------------------------- signals
    @workflow.signal(name=CLOSE_SIGNAL)
    def close(self) -> None:
        """The episode finishes or ends: refuse new calls, let running ones end."""
        self._closed = True

    @workflow.signal(name=HOLD_SIGNAL)
    def hold(self, request: HoldRequest) -> None:
        self._held = request.reason or "quarantined"

    @workflow.signal(name=RESUME_SIGNAL)
    def resume(self) -> None:
        self._held = ""

    # ------------------------------------------------------------- updates
    @workflow.update(name="exec")
    async def exec_update(self, request: ExecRequest) -> StepResult:
        async with self._call(locked=True):
            step_input = self._exec_input(request)
            try:
                result: StepResult = await self._local(
                    NodeActivities.exec_step,
                    step_input,
                    timeout_s=(request.timeout_s or self._input.default_timeout_s) + 60,
                )
            except (ActivityError, ApplicationError) as err:
                result = lost_step(step_input, err)
            return self._record(result)

    @workflow.update(name="tool_exec")
    async def tool_exec_update(self, request: ToolExecRequest) -> StepResult:
        async with self._call(locked=True):
            call = ToolExecInput(
                sandbox_id=self._input.sandbox_id,
                index=self._claim_index(),
                request=request,
                default_timeout_s=self._input.default_timeout_s,
                output_limit_bytes=self._input.output_limit_bytes,
                base_env=self._input.base_env,
            )
            timeout_s = (request.timeout_s or self._input.default_timeout_s) + 60
            result: StepResult = await surfaced(
                self._local(ToolCallActivities.tool_exec, call, timeout_s=timeout_s)
            )
            return self._record(result)

    @workflow.update(name="spawn")
    async def spawn_update(self, request: SpawnRequest) -> JobInfo:
        async with self._call(locked=True):
            call = SpawnInput(
                sandbox_id=self._input.sandbox_id,
                index=self._claim_index(),
                request=request,
                base_env=self._input.base_env,
            )
            info: JobInfo = await surfaced(
                self._local(ToolCallActivities.job_spawn, call, timeout_s=60)
            )
            return info

    @workflow.update(name="job_output")
    async def job_output_update(self, request: JobRequest) -> JobOutputResult:
        async with self._call():
            out: JobOutputResult = await surfaced(
                self._local(ToolCallActivities.job_output, self._job(request), timeout_s=60)
            )
            return out

    @workflow.update(name="job_wait")
    async def job_wait_update(self, request: JobRequest) -> JobState:
        async with self._call():
            timeout_s = (request.timeout_s or 0) + 60
            state: JobState = await surfaced(
                self._local(ToolCallActivities.job_wait, self._job(request), timeout_s=timeout_s)
            )
            return state

    @workflow.update(name="job_stdin")
    async def job_stdin_update(self, request: JobStdinRequest) -> None:
        async with self._call():
            call = JobStdinInput(sandbox_id=self._input.sandbox_id, request=request)
            await surfaced(self._local(ToolCallActivities.job_stdin, call, timeout_s=60))

    @workflow.update(name="job_kill")
    async def job_kill_update(self, request: JobRequest) -> None:
        async with self._call():
            await surfaced(
                self._local(ToolCallActivities.job_kill, self._job(request), timeout_s=60)
            )

    @exec_update.validator
    def _validate_exec(self, request: ExecRequest) -> None:
        self._check_open()

    @tool_exec_update.validator
    def _validate_tool_exec(self, request: ToolExecRequest) -> None:
        self._check_open()

    @spawn_update.validator
    def _validate_spawn(self, request: SpawnRequest) -> None:
        self._check_open()

    @job_output_update.validator
    def _validate_job_output(self, request: JobRequest) -> None:
        self._check_open()

    @job_wait_update.validator
    def _validate_job_wait(self, request: JobRequest) -> None:
        self._check_open()

    @job_stdin_update.validator
    def _validate_job_stdin(self, request: JobStdinRequest) -> None:
        self._check_open()

    @job_kill_update.validator
    def _validate_job_kill(self, request: JobRequest) -> None:
        self._check_open()

    @workflow.query
    def steps(self) -> list[StepResult]:
        return self._steps

    @workflow.query
    def progress(self) -> CallsProgress:
        return CallsProgress(
            steps_done=len(self._steps), last_call=self._last_call, held=self._held
        )

    # ------------------------------------------------------------- helpers
    def _check_open(self) -> None:
        """Refused calls leave no history (the server drops a rejected Update)."""
        episode = self._input.episode_id
        if self._closed:
            # The SDK asks the episode itself, which says why (ended, finishing).
            raise ApplicationError(f"episode {episode} takes calls itself now", type="CallsClosed")
        if self._held:
            raise ApplicationError(
                f"episode {episode} is {self._held}: release it first", type="EpisodeQuarantined"
            )

    @contextlib.asynccontextmanager
    async def _call(self, *, locked: bool = False) -> AsyncIterator[None]:
        """One call's span: running (so not idle), in turn when it starts
        processes; the idle clock restarts when it ends."""
        self._running += 1
        try:
            if locked:
                async with self._lock:
                    self._check_open()
                    yield
            else:
                self._check_open()
                yield
        finally:
            self._running -= 1
            self._last_call = workflow.now()

    def _claim_index(self) -> int:
        index = self._next_index
        self._next_index += 1
        return index

    def _exec_input(self, request: ExecRequest) -> ExecStepInput:
        return ExecStepInput(
            sandbox_id=self._input.sandbox_id,
            step=request.as_step(),
            index=self._claim_index(),
            source="interactive",
            default_timeout_s=self._input.default_timeout_s,
            output_limit_bytes=self._input.output_limit_bytes,
            base_env=self._input.base_env,
        )

    def _job(self, request: JobRequest) -> JobInput:
        return JobInput(sandbox_id=self._input.sandbox_id, request=request)

    def _record(self, result: StepResult) -> StepResult:
        self._steps.append(result)
        self._calls_this_run += 1
        return result

    async def _local(self, method: Callable[..., Any], arg: Any, *, timeout_s: float) -> Any:
        # Local: run by this node worker, beside the sandbox, no activity task.
        return await workflow.execute_local_activity_method(
            method,
            arg,
            start_to_close_timeout=timedelta(seconds=timeout_s),
            retry_policy=node_retry_policy(3),
        )
