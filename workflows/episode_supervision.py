"""The supervisor and the signals it acts on: while the body runs it watches
the maximum lifetime, the `anomaly` signals of the alert intake (kill, or
quarantine: hold the calls, freeze, wait for on-call's `release` or `kill` or
the quarantine's timeout, thaw), on-call's signals, admission's answer and
the registry's `node_lost`.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities.node import NodeActivities
    from activities.placement import NODE_LOST_SIGNAL
    from contract.ids import is_local_snapshot
    from contract.models import AlertSummary, NodeLostInput, StepResult
    from contract.search_attributes import ANOMALY_RULE
    from policies.alert import ANOMALY_SIGNAL
    from policies.responses import Decision
    from workflows.admission import AdmissionDecision
    from workflows.calls import HOLD_SIGNAL, RESUME_SIGNAL, HoldRequest
    from workflows.episode_calls import EpisodeCalls
    from workflows.episode_lean import EpisodeLean
    from workflows.episode_support import QUARANTINE_AFTER_BODY, Killed, settle
    from workflows.models import AnomalySignal, OnCallRequest


class EpisodeSupervision(EpisodeCalls, EpisodeLean):
    async def _supervise(self, body: asyncio.Task[StepResult | None]) -> None:
        """Wait for the body while honouring lifetime, kills and quarantines."""
        try:
            await self._watch(body)
        except asyncio.CancelledError:
            self._cancel_body(body)  # the workflow was cancelled: stop the body too
            await settle(body)
            raise

    async def _watch(self, body: asyncio.Task[StepResult | None]) -> None:
        assert self._s.started_at is not None
        deadline = self._s.started_at + timedelta(seconds=self._spec.timeouts.max_lifetime_s)
        while not body.done() or self._quarantine_after_body():
            if self._s.kill is None and self._s.pending_quarantines:
                await self._quarantine(self._s.pending_quarantines[0])
                continue
            if self._s.kill is not None:
                self._cancel_body(body)
                await settle(body)
                raise Killed(self._s.kill)
            remaining = (deadline - workflow.now()).total_seconds()
            if remaining <= 0:
                lifetime = self._spec.timeouts.max_lifetime_s
                self._end(f"maximum lifetime of {lifetime:g} s reached", outcome="timed_out")
                continue
            try:
                await workflow.wait_condition(
                    lambda: (
                        body.done() or self._s.kill is not None or bool(self._s.pending_quarantines)
                    ),
                    timeout=timedelta(seconds=remaining),
                )
            except TimeoutError:
                continue
        if self._s.kill is not None:
            raise Killed(self._s.kill)
        body.result()  # re-raise what the body raised

    def _quarantine_after_body(self) -> bool:
        """A quarantine ordered while the body ended is carried out, not dropped."""
        pending = self._s.kill is None and bool(self._s.pending_quarantines)
        return pending and workflow.patched(QUARANTINE_AFTER_BODY)

    # -------------------------------------------------------------- anomalies
    @workflow.signal(name=ANOMALY_SIGNAL)
    def anomaly(self, signal: AnomalySignal) -> None:
        alert, decision = signal.alert, signal.decision
        self._s.alerts.append(
            AlertSummary(
                rule=alert.rule,
                priority=str(alert.priority),
                action=decision.action,
                time=alert.time,
                output=alert.output[:1000],
            )
        )
        self._upsert(ANOMALY_RULE.value_set(self._s.rules))
        if decision.action == "kill":
            self._end(f"killed by rule '{alert.rule}'", rule=alert.rule)
        elif decision.action == "quarantine" and not decision.dry_run:
            self._s.pending_quarantines.append(decision)

    async def _quarantine(self, decision: Decision) -> None:
        """Freeze until on-call releases or kills, or the quarantine times out.
        The order stays pending until it is in force, so that requests and a
        release that arrive meanwhile see it."""
        try:
            if not self._s.quarantined and self._s.ready:
                await self._quarantined_until_decided(decision)
        finally:
            self._s.pending_quarantines.pop(0)

    async def _quarantined_until_decided(self, decision: Decision) -> None:
        rule = decision.rule
        reason = f"quarantined by rule '{rule}'"
        # The calls workflow refuses calls from before the freeze on: a call it
        # took in between would only block in the frozen sandbox.
        await self._signal_calls(HOLD_SIGNAL, HoldRequest(reason=reason))
        await self._node_activity(NodeActivities.freeze, self._sandbox_ref(), timeout_s=30)
        self._s.quarantined = True
        self._s.reason = reason
        self._set_state("quarantined")
        timeout_s = float(decision.parameters.get("timeout_s", self._spec.timeouts.quarantine_s))
        try:
            await workflow.wait_condition(
                lambda: self._s.release_requested or self._s.kill is not None,
                timeout=timedelta(seconds=timeout_s),
            )
        except TimeoutError:
            self._end(f"quarantine by rule '{rule}' timed out after {timeout_s:g} s", rule=rule)
        if self._s.kill is None:
            await self._node_activity(NodeActivities.thaw, self._sandbox_ref(), timeout_s=30)
            await self._signal_calls(RESUME_SIGNAL)  # takes calls again before it says `running`
            self._s.quarantined, self._s.release_requested, self._s.reason = False, False, ""
            self._set_state("running")

    # ------------------------------------------------------ on-call, fleet
    @workflow.signal
    def release(self, request: OnCallRequest) -> None:
        """On-call: let a quarantined episode go on (also one whose quarantine
        is ordered but not yet in force: the release must not be lost)."""
        if self._s.quarantined or self._s.pending_quarantines:
            self._s.release_requested = True

    @workflow.signal
    def kill(self, request: OnCallRequest) -> None:
        """On-call: end the episode now, tearing the sandbox down."""
        who = f" by {request.by}" if request.by else ""
        why = f": {request.reason}" if request.reason else ""
        self._end(f"killed by on-call{who}{why}")

    @workflow.signal
    def admission(self, decision: AdmissionDecision) -> None:
        """The admission workflow's answer: waiting (and why), admitted, rejected."""
        self._admission.decided(decision)

    @workflow.signal(name=NODE_LOST_SIGNAL)
    def node_lost(self, lost: NodeLostInput) -> None:
        """The registry lost this episode's node: place again if nothing ran there
        yet, else end the episode (its sandbox went with the node)."""
        if lost.node != self._s.node or self._s.closing:
            return
        if not self._s.ready or self._places_lean_again():
            self._lost_node = lost.node
            return
        if self._s.hibernated_ref and not is_local_snapshot(self._s.hibernated_ref):
            # Its sandbox went at hibernation and its snapshot is in the
            # registry: the next request restores it on another node.
            self._replace(lost.node)
            return
        self._s.node_lost = True
        self._end(lost.reason, outcome="failed")
