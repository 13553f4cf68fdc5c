"""The episode's side of its calls workflow (workflows/calls.py): an interactive
episode hands its tool calls to `EpisodeCallsWorkflow` on its node, passes it
hold/resume as quarantines come and go, tells it `close` at the end, and
takes its step log back, once.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import (
    ApplicationError,
    ChildWorkflowError,
    WorkflowAlreadyStartedError,
)
from temporalio.workflow import ChildWorkflowHandle, ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from contract.ids import calls_workflow_id
    from workflows.calls import (
        CLOSE_SIGNAL,
        HOLD_SIGNAL,
        MAX_CALLS_PER_RUN,
        RESUME_SIGNAL,
        CallsInput,
        CallsResult,
        EpisodeCallsWorkflow,
        HoldRequest,
    )
    from workflows.episode_hibernation import EpisodeHibernation
    from workflows.episode_support import CALLS_HOLD_AFTER_START, CALLS_LOG_WAIT_S


class EpisodeCalls(EpisodeHibernation):
    async def _serve_calls_on_node(self, ttl: timedelta) -> str:
        """Hand the calls to a workflow on the node (workflows/calls.py) until the
        episode finishes or has been idle for its timeout; the calls' step log
        and step indices come back when it ends."""
        # Calls the episode took itself (before it was ready) end first: the
        # child starts from the next free step index.
        await workflow.wait_condition(workflow.all_handlers_finished)
        self._calls_starting = True
        started_held = self._s.quarantined  # what _start_calls tells the child
        try:
            self._calls = await self._start_calls(ttl)
            await self._hold_as_now(started_held)
        except WorkflowAlreadyStartedError as err:
            # A calls run of this episode is still open (it ends by itself):
            # the episode serves its calls itself.
            workflow.logger.warning("calls of %s not on node: %s", self._s.sandbox_id, err)
            return "idle" if self._idle_left_s(ttl) <= 0 else "here"
        finally:
            self._calls_starting = False
        calls = self._calls
        try:
            await self._body_wait(lambda: calls.done() or self._s.finishing)
            await self._signal_calls(CLOSE_SIGNAL)
            return self._absorb(await calls).ended
        except ChildWorkflowError as err:
            self._calls = None
            if self._s.kill is not None:
                # A kill that met the child's start: the SDK cancels the child
                # and swallows the body's cancellation. Honour it here.
                raise asyncio.CancelledError from err
            # It failed or was cancelled from outside: the episode takes its calls.
            workflow.logger.warning("calls of %s ended: %s", self._s.sandbox_id, err)
            return "here"
        except asyncio.CancelledError:
            # Killed: the sandbox goes; `_close` collects the log. (Not in a
            # `finally`: a workflow evicted from the cache must not await.)
            await self._signal_calls(CLOSE_SIGNAL)
            raise

    def _calls_held(self) -> bool:
        """Whether the calls workflow should refuse calls now (a quarantine, in
        force or ordered)."""
        return self._s.quarantined or bool(self._s.pending_quarantines)

    async def _hold_as_now(self, started_held: bool) -> None:
        """The hold or resume the child missed while it was starting (signals
        to it are dropped until its handle exists)."""
        if self._calls_held() == started_held or not workflow.patched(CALLS_HOLD_AFTER_START):
            return
        if self._calls_held():
            reason = self._s.reason or "quarantined"
            await self._signal_calls(HOLD_SIGNAL, HoldRequest(reason=reason))
        else:
            await self._signal_calls(RESUME_SIGNAL)

    async def _start_calls(
        self, ttl: timedelta
    ) -> ChildWorkflowHandle[EpisodeCallsWorkflow, CallsResult]:
        after = self._spec.timeouts.hibernate_after_s
        idle_s = ttl.total_seconds() if after is None else min(after, ttl.total_seconds())
        return await workflow.start_child_workflow(
            EpisodeCallsWorkflow.run,
            CallsInput(
                episode_id=workflow.info().workflow_id,
                sandbox_id=self._s.sandbox_id,
                next_index=self._s.next_index,
                default_timeout_s=self._spec.timeouts.step_s,
                output_limit_bytes=self._spec.output_limit_bytes,
                base_env=self._spec.env,
                idle_timeout_s=idle_s,
                max_calls_per_run=min(
                    MAX_CALLS_PER_RUN, self._input.max_steps_per_run or MAX_CALLS_PER_RUN
                ),
                last_call=self._s.last_activity,
                held=self._s.reason if self._s.quarantined else "",
            ),
            id=calls_workflow_id(workflow.info().workflow_id),
            task_queue=self._queue(self._s.node),
            # Ends with the episode, even on a lost node nobody polls (pending calls then
            # fail over to the episode, which says how it ended).
            parent_close_policy=ParentClosePolicy.TERMINATE,
        )

    def _absorb(self, result: CallsResult) -> CallsResult:
        """The calls workflow's steps join the episode's log, once."""
        if self._calls is not None:
            self._s.steps.extend(result.steps)
            self._s.next_index = max(self._s.next_index, result.next_index)
            self._s.last_activity = max(self._s.last_activity or result.last_call, result.last_call)
            self._calls = None
        return result

    async def _collect_calls(self) -> None:
        """After a kill: the calls workflow ends once its running calls lost the
        sandbox; its step log belongs in the record. A lost node never answers."""
        calls = self._calls
        if calls is None or self._s.node_lost:
            return
        try:
            await workflow.wait_condition(calls.done, timeout=timedelta(seconds=CALLS_LOG_WAIT_S))
            self._absorb(calls.result())
        except (TimeoutError, asyncio.CancelledError, ChildWorkflowError) as err:
            workflow.logger.warning("calls of %s: no step log: %s", self._s.sandbox_id, err)

    def _calls_on_node(self) -> bool:
        """Calls go to the calls workflow while it runs (the SDK tries it first)."""
        return self._calls_starting or (self._calls is not None and not self._calls.done())

    def _check_calls_here(self) -> None:
        """Step indices are the calls workflow's while it runs: the SDK asks it."""
        if self._calls_on_node():
            raise ApplicationError(
                f"episode {workflow.info().workflow_id} takes its calls on its node",
                type="CallsOnNode",
            )

    async def _signal_calls(self, signal: str, *args: Any) -> None:
        """Tell the calls workflow, if it still runs (it may end meanwhile)."""
        calls = self._calls
        if calls is None or calls.done():
            return
        try:
            await calls.signal(signal, *args)
        except ApplicationError as err:
            workflow.logger.info("calls of %s missed %s: %s", self._s.sandbox_id, signal, err)
