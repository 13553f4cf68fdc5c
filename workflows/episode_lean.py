"""The lean path: a short scripted episode as one node activity (`run_scripted`:
provision, files, steps, reward; the node tears the sandbox down right after),
two workflow tasks in all. Placed again on another node when its node is lost
and the spec says its steps are idempotent.
"""

from __future__ import annotations

import asyncio

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities.node import NodeActivities
    from contract.models import ProvisionInput, RunScriptedInput, RunScriptedResult, StepResult
    from workflows.episode_placement import EpisodePlacement
    from workflows.episode_support import (
        LEAN_MAX_OUTPUT_BYTES,
        LEAN_MAX_STEPS,
        LEAN_PLACED_AGAIN,
        PROVISION_ATTEMPTS,
        file_request,
        settle,
        step_failed,
    )


class EpisodeLean(EpisodePlacement):
    def _lean(self) -> bool:
        """A short scripted episode runs as one node activity (provision, files,
        steps, reward; teardown right after on the node): two workflow tasks
        instead of one per activity. Interactive episodes, long scripts and
        outputs that could outgrow one payload take the step-by-step path."""
        spec = self._spec
        worst_output = (len(spec.steps) + 1) * 2 * spec.output_limit_bytes
        most_steps = min(LEAN_MAX_STEPS, self._input.max_steps_per_run or LEAN_MAX_STEPS)
        return (
            not spec.interactive
            and self._input.carried is None
            and len(spec.steps) <= most_steps
            and worst_output <= LEAN_MAX_OUTPUT_BYTES
        )

    async def _place_lean(self) -> None:
        """Placement only: the sandbox is made by the lean run itself. From here
        on quarantine and teardown find it by the episode's id on the node."""
        if not self._s.node:
            self._s.node = await self._place()
        self._s.ready = True

    async def _run_lean(self) -> StepResult | None:
        spec = self._spec
        budget_s = sum(step.timeout_s or spec.timeouts.step_s for step in spec.steps)
        if spec.reward is not None:
            budget_s += spec.reward.timeout_s or spec.timeouts.step_s
        request = RunScriptedInput(
            provision=ProvisionInput(
                sandbox_id=self._s.sandbox_id, spec=spec, labels=self._labels()
            ),
            files=[file_request(f) for f in spec.files],
            steps=spec.steps,
            reward=spec.reward,
            default_timeout_s=spec.timeouts.step_s,
            output_limit_bytes=spec.output_limit_bytes,
            base_env=spec.env,
            idempotent_steps=spec.idempotent_steps,
        )
        async with self._lock:
            self._touch()
            done = await self._lean_run_watched(request, timeout_s=300 + budget_s)
        self._s.sandbox_id, self._s.provision_s = (
            done.provision.sandbox_id,
            done.provision.provision_s,
        )
        self._s.torn_down = done.torn_down
        # The step log is the trajectory: the reward is its last entry, as on
        # the step-by-step path.
        self._s.steps.extend([*done.steps, *([done.reward] if done.reward else [])])
        self._s.next_index = len(self._s.steps)
        self._s.scripted_done = True
        self._touch()
        failed = next((step for step in done.steps if not step.ok), None)
        if failed is not None:
            raise step_failed(failed)
        return done.reward

    async def _lean_run_watched(
        self, request: RunScriptedInput, timeout_s: float
    ) -> RunScriptedResult:
        """The lean run, placed again on another node while its node is lost
        (`node_lost` says so only for idempotent steps: it cannot tell whether
        a step ran there). The lost node's sandbox is reaped once this ends."""
        while True:
            self._lost_node = ""
            run = asyncio.create_task(
                self._node_activity(
                    NodeActivities.run_scripted,
                    request,
                    timeout_s=timeout_s,
                    attempts=PROVISION_ATTEMPTS,
                )
            )
            await workflow.wait_condition(lambda: run.done() or bool(self._lost_node))  # noqa: B023 - awaited here
            if run.done():
                done: RunScriptedResult = run.result()
                return done
            run.cancel()
            await settle(run)
            self._replace(self._lost_node)
            self._s.node = await self._place()
            self._set_state("running")

    def _places_lean_again(self) -> bool:
        """A lost node takes a lean run that may run again elsewhere."""
        return (
            self._lean()
            and self._spec.idempotent_steps
            and not self._s.scripted_done
            and workflow.patched(LEAN_PLACED_AGAIN)
        )
