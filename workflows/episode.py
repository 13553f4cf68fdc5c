"""`EpisodeWorkflow`: one agent episode in one sandbox, durable end to end.

This module defines the workflow and its life: start, admission, the path
taken (lean or step by step), the supervised body, closing, continue-as-new.
The run coroutine is a supervisor. It places and provisions the sandbox, then
drives the episode body (scripted steps, interactive Updates, the reward) as
a child task while it watches three things the body cannot: the maximum
lifetime timer, anomaly signals from the alert intake, and on-call `kill` /
`release` signals. Teardown happens in `finally`, on every path except
continue-as-new, which hands the live sandbox to the next run.

The workflow's parts are mixins, one concern a module, over one state
(`EpisodeState`, in `EpisodeCore`), each importing only those below it:
`episode_core.py` (state, node activities, shared checks and waits),
`episode_view.py` (visibility, queries), `episode_placement.py` (placement,
provision), `episode_lean.py` (the lean path), `episode_hibernation.py`
(idle time, hibernate, wake), `episode_calls.py` (the calls workflow on the
node), `episode_body.py` (the step-by-step body), `episode_requests.py`
(tool-call Updates, `finish`), `episode_files.py` (file and snapshot
Updates), `episode_supervision.py` (the supervisor, quarantine, signals),
`episode_closing.py` (teardown, records, result); constants and pure helpers
in `episode_support.py`.

No I/O here: every side effect is an activity on the node's task queue.
"""

from __future__ import annotations

import asyncio

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from contract.models import EpisodeResult, StepResult
    from workflows.episode_closing import EpisodeClosing
    from workflows.episode_files import EpisodeFiles
    from workflows.episode_requests import EpisodeRequests
    from workflows.episode_supervision import EpisodeSupervision
    from workflows.episode_support import Killed, outcome_of
    from workflows.models import EpisodeInput
    from workflows.steps import cause_message


@workflow.defn
class EpisodeWorkflow(EpisodeSupervision, EpisodeClosing, EpisodeRequests, EpisodeFiles):
    @workflow.run
    async def run(self, input: EpisodeInput) -> EpisodeResult:
        continuing = False
        outcome, reason = "completed", ""
        reward: StepResult | None = None
        result: EpisodeResult | None = None
        try:
            if input.carried is None:
                await self._admission.admit(self._spec, input.admission, on_wait=self._wait_for)
                self._s.admission_held = self._admission.held
                if self._lean():
                    await self._place_lean()
                else:
                    await self._provision_watched()
            self._s.reason = ""
            self._set_state("running")
            body = asyncio.create_task(self._run_lean() if self._lean() else self._body())
            await self._supervise(body)
            reward = body.result()
            if self._s.continue_due:
                # The body stopped early to hand over; it ran no reward.
                continuing = True
            elif reward is not None and not reward.ok:
                outcome, reason = "failed", f"reward command exited {reward.exit_code}"
        except Killed as killed:
            outcome, reason = killed.order.outcome, killed.order.reason
        except asyncio.CancelledError:
            outcome, reason = "cancelled", "episode cancelled"
            raise
        except ApplicationError as err:
            outcome, reason = outcome_of(err), str(err.message)
            if err.type == "EpisodeRejected":
                self._failure_type = err.type  # the trainer sees the rejection as such
        except ActivityError as err:
            outcome, reason = "failed", cause_message(err)
        finally:
            if not continuing:
                result = await self._close(outcome, reason, reward)
        if result is None:  # only continue-as-new skips closing
            await workflow.wait_condition(workflow.all_handlers_finished)
            workflow.continue_as_new(self._carry())
        return self._raise_or_return(result)

    def _carry(self) -> EpisodeInput:
        return self._input.model_copy(update={"carried": self._s.carried(), "node": self._s.node})
