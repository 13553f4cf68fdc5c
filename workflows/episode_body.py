"""The step-by-step path's body: the scripted steps one `exec_step` activity
each, then (interactive episodes) the wait for `finish` under the idle clock,
which hands the calls to the node or hibernates, then the reward. It stops
early when continue-as-new is due; the next run goes on where it stopped.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.node import NodeActivities
    from contract.models import ExecStepInput, Step, StepResult
    from contract.script import runs_again
    from workflows.episode_calls import EpisodeCalls
    from workflows.episode_support import CALLS_ON_NODE, IDLE_TIMER_REARMED, step_failed
    from workflows.steps import lost_step


class EpisodeBody(EpisodeCalls):
    async def _body(self) -> StepResult | None:
        if not self._s.scripted_done:
            for step in self._spec.steps[self._s.next_index :]:
                if self._wants_continue_as_new():
                    self._s.continue_due = True
                    return None  # the next run goes on from this step
                await self._body_wait(self._unfrozen)
                async with self._lock:
                    result = await self._run_step(step, "scripted")
                if not result.ok:
                    raise step_failed(result)
            self._s.scripted_done = True
        if self._spec.interactive and not await self._wait_for_finish():
            self._s.continue_due = True
            return None  # continue-as-new is due: the next run goes on
        await self._body_wait(self._unfrozen)
        if self._spec.reward is None:
            return None
        async with self._lock:
            return await self._run_step(self._spec.reward, "reward")

    async def _wait_for_finish(self) -> bool:
        """Idle TTL as a durable timer. A request does not wake this loop (it
        only moves `last_activity`): when the timer fires early it is re-armed
        for the time left, so an exec costs no timer events. Histories made
        before this patch reset the timer at each request, and replay so."""
        ttl = timedelta(seconds=self._spec.timeouts.idle_ttl_s)
        rearm = workflow.patched(IDLE_TIMER_REARMED)
        if not self._s.hibernated_ref and workflow.patched(CALLS_ON_NODE):
            ended = await self._serve_calls_on_node(ttl)
            if ended == "closed":
                return True
            # Idle: the loop below hibernates the sandbox or ends the episode;
            # after a hibernation the episode serves its calls itself.
        while not self._s.finishing:
            seen = self._s.activity_seq
            try:
                await self._body_wait(
                    lambda: (
                        self._s.finishing
                        or (not rearm and self._s.activity_seq != seen)  # noqa: B023 - awaited within this iteration
                        or self._wants_continue_as_new()
                    ),
                    timeout=self._idle_timeout(ttl, rearm),
                )
            except TimeoutError:
                if rearm and self._s.quarantined:
                    # Quarantine has its own timer; idle time starts again on release.
                    await self._body_wait(lambda: not self._s.quarantined or self._s.finishing)
                    self._s.last_activity = workflow.now()
                    continue
                if rearm and (self._lock.locked() or self._idle_left_s(ttl) > 0):
                    # A request came, or one still runs: not idle yet.
                    await self._body_wait(lambda: not self._lock.locked())
                    continue
                if self._hibernate_due():
                    await self._hibernate()
                    continue
                if not self._s.quarantined:  # quarantine has its own timer
                    raise ApplicationError(
                        f"idle for {self._spec.timeouts.idle_ttl_s:g} s with no request",
                        type="IdleTimeout",
                        non_retryable=True,
                    ) from None
            if self._wants_continue_as_new() and not self._lock.locked():
                return False
        return True

    async def _run_step(self, step: Step, source: str) -> StepResult:
        result = await self._run_step_once(step, source)
        if source == "scripted" and runs_again(result, self._spec.idempotent_steps):
            # The spec says running a step twice is safe: once more, as a new step.
            result = await self._run_step_once(step, source)
        return result

    async def _run_step_once(self, step: Step, source: str) -> StepResult:
        index = self._claim_index()
        request = ExecStepInput(
            sandbox_id=self._s.sandbox_id,
            step=step,
            index=index,
            source=source,  # type: ignore[arg-type]
            default_timeout_s=self._spec.timeouts.step_s,
            output_limit_bytes=self._spec.output_limit_bytes,
            base_env=self._spec.env,
        )
        try:
            result: StepResult = await self._node_activity(
                NodeActivities.exec_step,
                request,
                timeout_s=(step.timeout_s or self._spec.timeouts.step_s) + 60,
            )
        except ActivityError as err:
            result = lost_step(request, err)  # a bad request re-raises
        return self._record_step(result)
