"""How the episode shows: every state in the workflow's details, the states
on-call filters by also in its search attributes and memo (each upsert
rewrites the visibility row, so passing states are not written), and the
queries `status`, `steps` and `spec`.
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from contract.models import EpisodeSpec, StepResult
    from contract.search_attributes import (
        EPISODE_STATE,
        SANDBOX_ID,
        SANDBOX_IMAGE,
        SANDBOX_NODE,
        TENANT,
    )
    from workflows.episode_core import EpisodeCore
    from workflows.episode_support import VISIBLE_STATES
    from workflows.models import EpisodeStatus


class EpisodeView(EpisodeCore):
    # ------------------------------------------------------------- queries
    @workflow.query
    def status(self) -> EpisodeStatus:
        return EpisodeStatus(
            episode_id=workflow.info().workflow_id,
            state=self._s.state,
            node=self._s.node,
            sandbox_id=self._s.sandbox_id,
            image=self._spec.image,
            tenant=self._spec.tenant,
            steps_done=len(self._s.steps),
            anomaly_rules=self._s.rules,
            quarantined=self._s.quarantined,
            last_activity=self._s.last_activity,
            reason=self._s.reason,
            queue_position=self._s.queue_position,
        )

    @workflow.query
    def steps(self) -> list[StepResult]:
        return self._s.steps

    @workflow.query
    def spec(self) -> EpisodeSpec:
        """What the episode runs (forks start their children from it)."""
        return self._spec

    # ------------------------------------------------------------ visibility
    def _set_state(self, state: str) -> None:
        """Every state shows in the workflow's details; only those on-call filters
        by are written to visibility, because each upsert rewrites its row."""
        self._s.state = state
        workflow.set_current_details(self._details())
        if state not in VISIBLE_STATES:
            return
        self._upsert(
            EPISODE_STATE.value_set(state),
            TENANT.value_set(self._spec.tenant),
            SANDBOX_IMAGE.value_set(self._spec.image),
            SANDBOX_ID.value_set(self._s.sandbox_id),
            *([SANDBOX_NODE.value_set(self._s.node)] if self._s.node else []),
        )
        workflow.upsert_memo(
            {
                "state": state,
                "node": self._s.node,
                "sandbox_id": self._s.sandbox_id,
                "reason": self._s.reason,
                "steps": len(self._s.steps),
            }
        )

    def _details(self) -> str:
        rules = ", ".join(self._s.rules) or "none"
        return (
            f"**{self._s.state}** on `{self._s.node or '?'}`, sandbox `{self._s.sandbox_id}`, "
            f"image `{self._spec.image}`, tenant `{self._spec.tenant}`; "
            f"{len(self._s.steps)} steps; alerts: {rules}"
            + (f"; {self._s.reason}" if self._s.reason else "")
        )

    def _upsert(self, *updates: Any) -> None:
        workflow.upsert_search_attributes(list(updates))
