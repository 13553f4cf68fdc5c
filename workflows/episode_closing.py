"""How an episode ends: the teardown (one node activity that also writes the
records; the control role records an episode with nothing to tear down), the
step log of a calls workflow killed mid-call, late alerts that still decide
the outcome, the admission room given back, and the workflow's own result:
killed and failed episodes fail the workflow.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.node import NodeActivities
    from contract.models import EpisodeResult, RecordEpisodeInput, StepResult, TeardownInput
    from workflows.episode_calls import EpisodeCalls
    from workflows.episode_support import LATE_ALERTS, sensor_verdict


class EpisodeClosing(EpisodeCalls):
    async def _close(self, outcome: str, reason: str, reward: StepResult | None) -> EpisodeResult:
        self._s.reason, self._outcome = reason, outcome
        self._s.closing = True
        self._set_state("closing")
        info = workflow.info()
        result = EpisodeResult(
            episode_id=info.workflow_id,
            outcome=outcome,  # type: ignore[arg-type]
            reason=reason,
            node=self._s.node,
            sandbox_id=self._s.sandbox_id,
            image=self._spec.image,
            tenant=self._spec.tenant,
            steps=self._s.steps,
            reward=reward,
            alerts=self._s.alerts,
            started_at=self._s.started_at,
            ended_at=workflow.now(),
            provision_s=self._s.provision_s,
        )
        record = RecordEpisodeInput(result=result, workflow_id=info.workflow_id, run_id=info.run_id)
        if self._s.torn_down or not self._s.node or self._s.node_lost:
            # Nothing to tear down (a lean run's node did it, or the node is
            # gone): the control role records the episode, in this task.
            await workflow.execute_local_activity(
                "corral.record_episode", record, start_to_close_timeout=timedelta(seconds=10)
            )
        else:
            # One activity tears down and records: a second one per episode
            # cost the server more than the record is worth.
            calls_running = self._calls_on_node()  # killed with calls on the node
            result.teardown_s, teardown_sensor = await self._teardown(
                record, write_record=not calls_running
            )
            if calls_running:
                # Their steps end once the sandbox is gone; then the record.
                await self._collect_calls()
                result.steps = self._s.steps
                await workflow.execute_local_activity(
                    "corral.record_episode", record, start_to_close_timeout=timedelta(seconds=10)
                )
            result.sensor = sensor_verdict([*self._s.steps, teardown_sensor])
            self._late_alerts(result)
        if not result.sensor:
            result.sensor = sensor_verdict(self._s.steps)
        await self._admission.release()  # after teardown: the room is free again
        self._set_state(outcome)
        return result

    def _late_alerts(self, result: EpisodeResult) -> None:
        """An alert the teardown's watermark brought in decides the outcome: the
        agent did it (a background process, after its last step)."""
        kill = self._s.kill
        late = (kill is not None and kill.rule) or self._s.pending_quarantines
        if result.outcome != "completed" or not late or not workflow.patched(LATE_ALERTS):
            return
        result.alerts = self._s.alerts
        if kill is not None and kill.rule:
            result.outcome, result.reason = "killed", kill.reason
        elif self._s.pending_quarantines:
            rule = self._s.pending_quarantines[0].rule
            # Its sandbox is gone: nothing is left to hold for on-call.
            result.outcome = "killed"
            result.reason = f"quarantined by rule '{rule}' as the episode ended"

    async def _teardown(
        self, record: RecordEpisodeInput, *, write_record: bool = True
    ) -> tuple[float, str]:
        """Always attempted; if the node is gone, the janitor reaps the sandbox."""
        try:
            done = await self._node_activity(
                NodeActivities.teardown,
                TeardownInput(
                    sandbox_id=self._s.sandbox_id,
                    workflow_id=record.workflow_id,
                    run_id=record.run_id,
                    record=record if write_record else None,
                    drop_images=self._s.hibernations,
                ),
                timeout_s=120,
            )
            return float(done.teardown_s), done.sensor
        except ActivityError as err:
            workflow.logger.warning("teardown of %s failed: %s", self._s.sandbox_id, err)
            return 0.0, ""

    def _raise_or_return(self, result: EpisodeResult) -> EpisodeResult:
        """Killed and failed episodes fail the workflow, so the Web UI shows them red."""
        if result.outcome == "completed":
            return result
        error_type = self._failure_type or {
            "killed": "EpisodeKilled",
            "timed_out": "EpisodeTimedOut",
        }.get(result.outcome, "EpisodeFailed")
        raise ApplicationError(
            result.reason, result.model_dump(mode="json"), type=error_type, non_retryable=True
        )
