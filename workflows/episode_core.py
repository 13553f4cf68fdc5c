"""The ground every part of `EpisodeWorkflow` stands on: its one state (the
`EpisodeState` model continue-as-new carries, plus what lives in one run
only), the step log's indices, how a node is asked (an activity on the
node's queue), and the checks and waits the requests and the body share.

The other parts are mixins over `EpisodeCore` in workflows/episode_*.py;
workflows/episode.py combines them into the workflow.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError
from temporalio.workflow import ChildWorkflowHandle

with workflow.unsafe.imports_passed_through():
    from contract.ids import sandbox_id_for
    from contract.models import Outcome, SandboxRef, StepResult
    from workflows.admission import Admission
    from workflows.calls import CallsResult, EpisodeCallsWorkflow
    from workflows.episode_support import MAX_STEPS_PER_RUN
    from workflows.models import EpisodeInput, EpisodeState, KillOrder
    from workflows.steps import node_retry_policy


class EpisodeCore:
    @workflow.init
    def __init__(self, input: EpisodeInput) -> None:
        if input.carried is None and input.spec.model_gateway is not None:
            # The episode's own gateway key, drawn once; later runs carry it.
            keyed = input.spec.with_gateway_key(f"corral-{workflow.uuid4().hex}")
            input = input.model_copy(update={"spec": keyed})
        self._input = input
        self._spec = input.spec
        if input.carried is not None:
            self._s = input.carried.next_run()
        else:
            now = workflow.now()
            self._s = EpisodeState(
                sandbox_id=sandbox_id_for(workflow.info().workflow_id),
                node=input.node or "",
                started_at=now,
                last_activity=now,
            )
        # Serialises sandbox work: a step, a file operation, the reward.
        self._lock = asyncio.Lock()
        self._lost_node = ""  # set by `node_lost` while provisioning
        self._avoid: list[str] = []  # nodes lost or full under this episode
        self._admission = Admission(held=self._s.admission_held)
        self._failure_type = ""  # overrides the outcome's error type (a rejection)
        self._outcome = ""  # how the episode ends, once it is closing
        # The calls workflow on the node while it serves this episode's calls.
        self._calls: ChildWorkflowHandle[EpisodeCallsWorkflow, CallsResult] | None = None
        self._body_cancelled = False  # see _body_wait
        self._calls_starting = False

    # ------------------------------------------------------- checks and waits
    async def _wait_interactive(self) -> None:
        """Interactive requests run after the sandbox is up and the scripted steps
        are done, never beside them; if the episode ends first, they are refused."""
        await workflow.wait_condition(
            lambda: (
                (self._s.ready and self._s.scripted_done)
                or self._s.closing
                or self._s.kill is not None
            )
        )
        self._check_open()

    def _check_open(self) -> None:
        episode = workflow.info().workflow_id
        if self._s.kill is not None or self._s.closing:
            why = self._s.kill.reason if self._s.kill else self._s.reason
            how = self._s.kill.outcome if self._s.kill else self._outcome
            raise ApplicationError(
                f"episode {episode} has ended: {how}" + (f": {why}" if why else ""),
                {"outcome": how, "reason": why},
                type="EpisodeEnded",
            )
        if self._s.finishing:
            raise ApplicationError(
                f"episode {episode} is finishing: no more requests", type="EpisodeFinishing"
            )
        if self._s.quarantined or self._s.pending_quarantines:
            raise ApplicationError(
                f"episode {episode} is quarantined ({self._s.reason}): release it first",
                type="EpisodeQuarantined",
            )

    def _end(self, reason: str, *, rule: str | None = None, outcome: Outcome = "killed") -> None:
        """Order the end of the episode; the first order wins."""
        if self._s.kill is None:
            self._s.kill = KillOrder(reason=reason, rule=rule, outcome=outcome)

    async def _wait_unfrozen(self) -> None:
        await workflow.wait_condition(self._unfrozen)

    def _unfrozen(self) -> bool:
        return not self._s.quarantined and not self._s.pending_quarantines

    async def _body_wait(
        self, condition: Callable[[], bool], timeout: timedelta | None = None
    ) -> None:
        """The body's waits, which its cancellation ends even if the SDK erased it.

        A task cancelled while it awaits a signal to another workflow keeps
        awaiting the signal's own outcome and then goes on as if never
        cancelled (the SDK's `_await_temporal_operation`). A kill that met the
        hold sent to the calls workflow did that, and the episode hung, killed
        but never closed. The body raises here instead, where the cancellation
        would have reached it, so the commands are the same as when it did."""
        await workflow.wait_condition(lambda: condition() or self._body_cancelled, timeout=timeout)
        if self._body_cancelled:
            raise asyncio.CancelledError

    def _cancel_body(self, body: asyncio.Task[Any]) -> None:
        self._body_cancelled = True
        body.cancel()

    def _wants_continue_as_new(self) -> bool:
        return self._s.ready and (
            workflow.info().is_continue_as_new_suggested()
            or self._s.steps_this_run >= (self._input.max_steps_per_run or MAX_STEPS_PER_RUN)
        )

    # -------------------------------------------------------------- step log
    def _claim_index(self) -> int:
        """The next step's index in the episode's step log (requests are counted too)."""
        index = self._s.next_index
        self._s.next_index += 1
        self._touch()
        return index

    def _record_step(self, result: StepResult) -> StepResult:
        self._s.steps.append(result)
        self._s.steps_this_run += 1
        self._touch()
        return result

    def _touch(self) -> None:
        self._s.activity_seq += 1
        self._s.last_activity = workflow.now()

    # ------------------------------------------------------------ the node
    def _queue(self, node: str) -> str:
        return f"{self._input.node_task_queue_prefix}{node}"

    async def _node_activity(
        self, method: Any, arg: Any, *, timeout_s: float, attempts: int = 3
    ) -> Any:
        return await workflow.execute_activity_method(
            method,
            arg,
            task_queue=self._queue(self._s.node),
            start_to_close_timeout=timedelta(seconds=timeout_s),
            # Bounded even when the node's queue is never polled again.
            schedule_to_close_timeout=timedelta(seconds=(timeout_s + 30) * attempts),
            heartbeat_timeout=timedelta(seconds=15),
            retry_policy=node_retry_policy(attempts),
        )

    def _sandbox_ref(self) -> SandboxRef:
        return SandboxRef(sandbox_id=self._s.sandbox_id, workflow_id=workflow.info().workflow_id)
