"""`EpisodeWorkflow`: one agent episode in one sandbox, durable end to end.

The run coroutine is a supervisor. It places and provisions the sandbox, then
drives the episode body (scripted steps, interactive Updates, the reward) as
a child task while it watches three things the body cannot: the maximum
lifetime timer, anomaly signals from the alert intake, and on-call `kill` /
`release` signals. Teardown happens in `finally`, on every path except
continue-as-new, which hands the live sandbox to the next run.

No I/O here: every side effect is an activity on the node's task queue.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    ChildWorkflowError,
    WorkflowAlreadyStartedError,
    is_cancelled_exception,
)
from temporalio.workflow import ChildWorkflowHandle, ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from activities.models import (
        AlertSummary,
        EpisodeResult,
        EpisodeSpec,
        ExecRequest,
        ExecStepInput,
        FileContent,
        FileSpec,
        NodeLostInput,
        Outcome,
        PlaceInput,
        Placement,
        ProvisionInput,
        ReadFileInput,
        ReadFileRequest,
        RecordEpisodeInput,
        RunScriptedInput,
        RunScriptedResult,
        SandboxRef,
        SnapshotInput,
        SnapshotRequest,
        SnapshotResult,
        Step,
        StepResult,
        TeardownInput,
        WriteFileInput,
        WriteFileRequest,
    )
    from activities.node import NodeActivities
    from activities.placement import NODE_LOST_SIGNAL
    from activities.snapshots import SnapshotActivities
    from activities.toolcalls import (
        GetFileInput,
        GetFileRequest,
        JobInfo,
        JobInput,
        JobOutputResult,
        JobRequest,
        JobState,
        JobStdinInput,
        JobStdinRequest,
        PutFileInput,
        PutFileRequest,
        SpawnInput,
        SpawnRequest,
        ToolCallActivities,
        ToolExecInput,
        ToolExecRequest,
    )
    from policies.alert import ANOMALY_SIGNAL
    from policies.responses import Decision
    from sandbox.blobs import FileBlob
    from sandbox.labels import (
        NODE_LABEL,
        OWNER_LABEL,
        RUN_ID_LABEL,
        TENANT_LABEL,
        USER_LABEL_PREFIX,
    )
    from sandbox.snapshot import is_local_snapshot, snapshot_ref
    from workflows.admission import Admission, AdmissionDecision
    from workflows.calls import (
        CLOSE_SIGNAL,
        HOLD_SIGNAL,
        MAX_CALLS_PER_RUN,
        RESUME_SIGNAL,
        CallsInput,
        CallsResult,
        EpisodeCallsWorkflow,
        HoldRequest,
        calls_workflow_id,
    )
    from workflows.models import (
        AnomalySignal,
        EpisodeInput,
        EpisodeState,
        EpisodeStatus,
        KillOrder,
        OnCallRequest,
    )
    from workflows.search_attributes import (
        ANOMALY_RULE,
        EPISODE_STATE,
        SANDBOX_ID,
        SANDBOX_IMAGE,
        SANDBOX_NODE,
        TENANT,
    )
    from workflows.steps import (
        application_cause,
        cause_message,
        lost_step,
        node_retry_policy,
        surfaced,
    )

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

T = TypeVar("T")


def sandbox_id_for(workflow_id: str) -> str:
    """Deterministic sandbox id: a retried provision finds the same sandbox.

    64 hex digits, like the container ids Falco's container plugin reports, so
    `container.id` (the first 12) and `container.full_id` mean the same here
    as under real Falco. The workflow id travels in the container's labels.
    """
    return hashlib.sha256(workflow_id.encode()).hexdigest()


class _Killed(Exception):
    """Raised inside the workflow to end the episode now (rule, on-call or timer)."""

    def __init__(self, order: KillOrder) -> None:
        super().__init__(order.reason)
        self.order = order


@workflow.defn
class EpisodeWorkflow:
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

    # ------------------------------------------------------------------ run
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
        except _Killed as killed:
            outcome, reason = killed.order.outcome, killed.order.reason
        except asyncio.CancelledError:
            outcome, reason = "cancelled", "episode cancelled"
            raise
        except ApplicationError as err:
            outcome, reason = _outcome_of(err), str(err.message)
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

    async def _supervise(self, body: asyncio.Task[StepResult | None]) -> None:
        """Wait for the body while honouring lifetime, kills and quarantines."""
        try:
            await self._watch(body)
        except asyncio.CancelledError:
            self._cancel_body(body)  # the workflow was cancelled: stop the body too
            await _settle(body)
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
                await _settle(body)
                raise _Killed(self._s.kill)
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
            raise _Killed(self._s.kill)
        body.result()  # re-raise what the body raised

    def _quarantine_after_body(self) -> bool:
        """A quarantine ordered while the body ended is carried out, not dropped."""
        pending = self._s.kill is None and bool(self._s.pending_quarantines)
        return pending and workflow.patched(QUARANTINE_AFTER_BODY)

    # ---------------------------------------------------------------- phases
    async def _provision_watched(self) -> None:
        """Provision while watching for a kill or the loss of the node.

        A node lost before the sandbox is up costs nothing but time: the
        episode is placed again elsewhere (its leftovers are reaped when the
        node comes back). A node that turns out full is skipped the same way.
        """
        while True:
            self._lost_node = ""
            task = asyncio.create_task(self._provision())
            await workflow.wait_condition(
                lambda: task.done() or self._s.kill is not None or bool(self._lost_node),  # noqa: B023 - awaited here
            )
            if not task.done():
                task.cancel()
                await _settle(task)
                if self._s.kill is not None:
                    raise _Killed(self._s.kill)
                self._replace(self._lost_node)
                continue
            try:
                task.result()
                return
            except ActivityError as err:
                cause = application_cause(err)
                if cause is None or cause.type != "NodeFull" or self._input.node:
                    raise
                if workflow.patched(NODE_FULL_WAITS):
                    # Full now is not full for ever (a one-node fleet would
                    # exclude its only node): wait, then place again.
                    self._wait_for(f"{self._s.node} is full: {cause.message}")
                    self._s.node = ""
                    await workflow.sleep(PLACE_RETRY_S)
                    continue
                self._replace(self._s.node)

    def _replace(self, node: str) -> None:
        """Forget a node that cannot take this episode; placement picks another."""
        workflow.logger.info("placing %s again: %s cannot take it", self._s.sandbox_id, node)
        self._avoid.append(node)
        self._s.node = ""

    async def _provision(self) -> None:
        if not self._s.node:
            self._s.node = await self._place()
        self._set_state("provisioning")
        result = await self._node_activity(
            NodeActivities.provision,
            ProvisionInput(sandbox_id=self._s.sandbox_id, spec=self._spec, labels=self._labels()),
            timeout_s=300,
            attempts=PROVISION_ATTEMPTS,
        )
        self._s.provision_s = result.provision_s
        # A warm sandbox keeps its own id; every later activity uses the real one.
        self._s.sandbox_id = result.sandbox_id
        for spec_file in self._spec.files:
            await self._node_activity(
                NodeActivities.write_file,
                WriteFileInput(sandbox_id=self._s.sandbox_id, request=_file_request(spec_file)),
                timeout_s=60,
            )
        self._s.ready = True

    def _labels(self) -> dict[str, str]:
        info = workflow.info()
        return {
            OWNER_LABEL: info.workflow_id,
            RUN_ID_LABEL: info.run_id,
            TENANT_LABEL: self._spec.tenant,
            NODE_LABEL: self._s.node,
            **{f"{USER_LABEL_PREFIX}{k}": v for k, v in self._spec.labels.items()},
        }

    def _wait_for(self, reason: str) -> None:
        """Show why the episode waits (quota, room) in the Web UI and visibility."""
        if self._s.state != "waiting" or self._s.reason != reason:
            self._s.reason = reason
            self._set_state("waiting")

    async def _place(self, image: str = "") -> str:
        """A node from the registry (a local activity: no node is asked); while
        none has room the episode waits, visibly, and asks again."""
        resources = self._spec.resources
        request = PlaceInput(
            image=image or self._spec.image,
            cpu_cores=resources.cpu_cores,
            memory_mb=resources.memory_mb,
            pids=resources.pids_limit,
            exclude=self._avoid,
        )
        while True:
            placement: Placement = await workflow.execute_local_activity(
                "corral.place",
                request,
                result_type=Placement,
                start_to_close_timeout=timedelta(seconds=5),
            )
            self._s.queue_position = placement.position
            if placement.node is not None:
                return placement.node
            self._wait_for(placement.reason)
            await workflow.sleep(PLACE_RETRY_S)

    # ------------------------------------------------------------ lean path
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
            files=[_file_request(f) for f in spec.files],
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
            raise _step_failed(failed)
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
            await _settle(run)
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
                    raise _step_failed(result)
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

    async def _signal_calls(self, signal: str, *args: Any) -> None:
        """Tell the calls workflow, if it still runs (it may end meanwhile)."""
        calls = self._calls
        if calls is None or calls.done():
            return
        try:
            await calls.signal(signal, *args)
        except ApplicationError as err:
            workflow.logger.info("calls of %s missed %s: %s", self._s.sandbox_id, signal, err)

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

    async def _run_step(self, step: Step, source: str) -> StepResult:
        result = await self._run_step_once(step, source)
        if result.interrupted and source == "scripted" and self._spec.idempotent_steps:
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

    # ------------------------------------------------------ snapshot, hibernate
    async def _take_snapshot(self, name: str | None) -> SnapshotResult:
        episode = workflow.info().workflow_id
        ref = snapshot_ref(episode, name or f"s{len(self._s.snapshots) + 1}")
        result: SnapshotResult = await self._node_activity(
            SnapshotActivities.snapshot,
            SnapshotInput(sandbox_id=self._s.sandbox_id, ref=ref, episode_id=episode),
            timeout_s=600,
        )
        self._s.snapshots.append(result.ref)
        return result

    def _hibernate_due(self) -> bool:
        after = self._spec.timeouts.hibernate_after_s
        return after is not None and not self._s.hibernated_ref and not self._s.quarantined

    def _idle_timeout(self, ttl: timedelta, rearm: bool) -> timedelta:
        """The idle TTL, or the time left until hibernation when that comes first."""
        after = self._spec.timeouts.hibernate_after_s
        if (after is None or self._s.quarantined) and not rearm:
            return ttl
        return timedelta(seconds=max(self._idle_left_s(ttl), 0.001))

    def _idle_left_s(self, ttl: timedelta) -> float:
        """Seconds until the episode has been idle for the TTL (or hibernation is due)."""
        after = self._spec.timeouts.hibernate_after_s
        idle_s = (workflow.now() - (self._s.last_activity or workflow.now())).total_seconds()
        due_s = ttl.total_seconds()
        if after is not None and not self._s.quarantined and not self._s.hibernated_ref:
            due_s = min(after, due_s)
        return due_s - idle_s

    async def _hibernate(self) -> None:
        """Snapshot the idle sandbox and free it; the next request restores it."""
        async with self._lock:
            result = await self._take_snapshot(f"hibernate-{self._s.next_index}")
            await self._node_activity(
                NodeActivities.teardown, TeardownInput(sandbox_id=self._s.sandbox_id), timeout_s=120
            )
            self._s.hibernated_ref = result.ref
            self._s.hibernations.append(result.ref)
            self._set_state("hibernated")

    async def _wake(self) -> None:
        """Restore a hibernated sandbox (same node, same id) from its snapshot;
        on another node when its own was lost and the snapshot is in a registry."""
        if not self._s.hibernated_ref:
            return
        spec = self._spec.model_copy(update={"image": self._s.hibernated_ref})
        if not self._s.node:  # its node was lost while it slept
            self._s.node = await self._place(self._s.hibernated_ref)
        result = await self._node_activity(
            NodeActivities.provision,
            ProvisionInput(sandbox_id=self._s.sandbox_id, spec=spec, labels=self._labels()),
            timeout_s=300,
            attempts=PROVISION_ATTEMPTS,
        )
        self._s.sandbox_id, self._s.hibernated_ref = result.sandbox_id, ""
        self._set_state("running")

    @workflow.update
    async def snapshot(self, request: SnapshotRequest) -> SnapshotResult:
        """Commit the sandbox's filesystem as an image: `EpisodeSpec(image=ref)` starts from it."""
        await workflow.wait_condition(
            lambda: self._s.ready or self._s.closing or self._s.kill is not None
        )
        async with self._lock:
            self._check_open()
            await surfaced(self._wake())
            self._touch()
            return await surfaced(self._take_snapshot(request.name))

    @snapshot.validator
    def _validate_snapshot(self, request: SnapshotRequest) -> None:
        self._check_open()

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

    def _end(self, reason: str, *, rule: str | None = None, outcome: Outcome = "killed") -> None:
        """Order the end of the episode; the first order wins."""
        if self._s.kill is None:
            self._s.kill = KillOrder(reason=reason, rule=rule, outcome=outcome)

    # ------------------------------------------------------------- updates
    # A request that cannot run fails with an ApplicationError whose type the
    # SDK maps to a trainer exception: EpisodeEnded, EpisodeQuarantined,
    # EpisodeFinishing, or the sandbox layer's error (FileNotFound, ...).
    @workflow.update(name="exec")
    async def exec_update(self, request: ExecRequest) -> StepResult:
        await self._wait_interactive()
        async with self._lock:
            await self._wait_unfrozen()
            self._check_open()
            await surfaced(self._wake())
            return await surfaced(self._run_step(request.as_step(), "interactive"))

    @exec_update.validator
    def _validate_exec(self, request: ExecRequest) -> None:
        self._check_open()
        self._check_calls_here()

    @workflow.update
    async def write_file(self, request: WriteFileRequest) -> None:
        await self._wait_interactive()
        async with self._lock:
            self._check_open()
            await surfaced(self._wake())
            self._touch()
            await surfaced(
                self._node_activity(
                    NodeActivities.write_file,
                    WriteFileInput(sandbox_id=self._s.sandbox_id, request=request),
                    timeout_s=60,
                )
            )

    @write_file.validator
    def _validate_write_file(self, request: WriteFileRequest) -> None:
        self._check_open()
        try:
            base64.b64decode(request.content_b64, validate=True)
        except ValueError as err:
            raise ApplicationError(
                f"content_b64 is not base64: {err}", type="InvalidRequest"
            ) from None

    @workflow.update
    async def read_file(self, request: ReadFileRequest) -> FileContent:
        await self._wait_interactive()
        async with self._lock:
            self._check_open()
            await surfaced(self._wake())
            self._touch()
            content: FileContent = await surfaced(
                self._node_activity(
                    NodeActivities.read_file,
                    ReadFileInput(sandbox_id=self._s.sandbox_id, request=request),
                    timeout_s=60,
                )
            )
            return content

    @read_file.validator
    def _validate_read_file(self, request: ReadFileRequest) -> None:
        self._check_open()

    # Files of any size: the bytes travel as a registry blob, the history holds its digest.
    @workflow.update(name="put_file")
    async def put_file_update(self, request: PutFileRequest) -> None:
        await self._file_activity(
            ToolCallActivities.file_put,
            PutFileInput(sandbox_id=self._s.sandbox_id, request=request),
        )

    @put_file_update.validator
    def _validate_put_file(self, request: PutFileRequest) -> None:
        self._check_open()

    @workflow.update(name="get_file")
    async def get_file_update(self, request: GetFileRequest) -> FileBlob:
        blob: FileBlob = await self._file_activity(
            ToolCallActivities.file_get,
            GetFileInput(sandbox_id=self._s.sandbox_id, request=request),
        )
        return blob

    @get_file_update.validator
    def _validate_get_file(self, request: GetFileRequest) -> None:
        self._check_open()

    async def _file_activity(self, method: Any, call: Any) -> Any:
        """As `write_file`/`read_file` do: in turn with other requests, the sandbox awake."""
        await self._wait_interactive()
        async with self._lock:
            self._check_open()
            await surfaced(self._wake())
            self._touch()
            return await surfaced(self._node_activity(method, call, timeout_s=600))

    # Tool calls through the exec agent (activities/toolcalls.py, docs/agent.md).
    @workflow.update(name="tool_exec")
    async def tool_exec_update(self, request: ToolExecRequest) -> StepResult:
        """An exec in a named session (cwd and exported variables carry over)."""
        await self._wait_interactive()
        async with self._lock:
            await self._wait_unfrozen()
            self._check_open()
            await surfaced(self._wake())
            index = self._claim_index()
            timeout_s = request.timeout_s or self._spec.timeouts.step_s
            call = ToolExecInput(
                sandbox_id=self._s.sandbox_id,
                index=index,
                request=request,
                default_timeout_s=self._spec.timeouts.step_s,
                output_limit_bytes=self._spec.output_limit_bytes,
                base_env=self._spec.env,
            )
            result: StepResult = await surfaced(
                self._node_activity(ToolCallActivities.tool_exec, call, timeout_s=timeout_s + 60)
            )
            return self._record_step(result)

    @tool_exec_update.validator
    def _validate_tool_exec(self, request: ToolExecRequest) -> None:
        self._check_open()
        self._check_calls_here()

    @workflow.update(name="spawn")
    async def spawn_update(self, request: SpawnRequest) -> JobInfo:
        """A background job: it outlives the call; read, wait for and kill it by id."""
        await self._wait_interactive()
        async with self._lock:
            await self._wait_unfrozen()
            self._check_open()
            await surfaced(self._wake())
            index = self._claim_index()
            call = SpawnInput(
                sandbox_id=self._s.sandbox_id, index=index, request=request, base_env=self._spec.env
            )
            info: JobInfo = await surfaced(
                self._node_activity(ToolCallActivities.job_spawn, call, timeout_s=60)
            )
            return info

    @spawn_update.validator
    def _validate_spawn(self, request: SpawnRequest) -> None:
        self._check_open()
        self._check_calls_here()

    @workflow.update(name="job_output")
    async def job_output_update(self, request: JobRequest) -> JobOutputResult:
        self._check_open()
        self._touch()
        call = JobInput(sandbox_id=self._s.sandbox_id, request=request)
        out: JobOutputResult = await surfaced(
            self._node_activity(ToolCallActivities.job_output, call, timeout_s=60)
        )
        return out

    @workflow.update(name="job_wait")
    async def job_wait_update(self, request: JobRequest) -> JobState:
        self._check_open()
        self._touch()
        call = JobInput(sandbox_id=self._s.sandbox_id, request=request)
        timeout_s = (request.timeout_s or 0) + 60
        state: JobState = await surfaced(
            self._node_activity(ToolCallActivities.job_wait, call, timeout_s=timeout_s)
        )
        return state

    @workflow.update(name="job_stdin")
    async def job_stdin_update(self, request: JobStdinRequest) -> None:
        """Typed into a job's terminal (`corral episode shell`) or piped to its stdin."""
        self._check_open()
        self._touch()
        call = JobStdinInput(sandbox_id=self._s.sandbox_id, request=request)
        await surfaced(self._node_activity(ToolCallActivities.job_stdin, call, timeout_s=60))

    @workflow.update(name="job_kill")
    async def job_kill_update(self, request: JobRequest) -> None:
        self._check_open()
        self._touch()
        call = JobInput(sandbox_id=self._s.sandbox_id, request=request)
        await surfaced(self._node_activity(ToolCallActivities.job_kill, call, timeout_s=60))

    @workflow.update
    async def finish(self) -> None:
        """Ask the episode to compute its reward and end; returns at once."""
        self._s.finishing = True
        self._touch()

    @finish.validator
    def _validate_finish(self) -> None:
        if not self._spec.interactive:
            raise ApplicationError(
                "episode is not interactive: it finishes by itself", type="InvalidRequest"
            )
        self._check_open()

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

    def _check_calls_here(self) -> None:
        """Step indices are the calls workflow's while it runs: the SDK asks it."""
        if self._calls_on_node():
            raise ApplicationError(
                f"episode {workflow.info().workflow_id} takes its calls on its node",
                type="CallsOnNode",
            )

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

    # ------------------------------------------------------------- closing
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
            result.sensor = _sensor_verdict([*self._s.steps, teardown_sensor])
            self._late_alerts(result)
        if not result.sensor:
            result.sensor = _sensor_verdict(self._s.steps)
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

    # -------------------------------------------------------- continue-as-new
    def _wants_continue_as_new(self) -> bool:
        return self._s.ready and (
            workflow.info().is_continue_as_new_suggested()
            or self._s.steps_this_run >= (self._input.max_steps_per_run or MAX_STEPS_PER_RUN)
        )

    def _carry(self) -> EpisodeInput:
        return self._input.model_copy(update={"carried": self._s.carried(), "node": self._s.node})

    # ------------------------------------------------------------- helpers
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

    def _touch(self) -> None:
        self._s.activity_seq += 1
        self._s.last_activity = workflow.now()

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


async def _settle(task: asyncio.Task[Any]) -> None:
    """Wait for a cancelled task to unwind, swallowing its cancellation."""
    try:
        await task
    except BaseException as err:
        if not (isinstance(err, asyncio.CancelledError) or is_cancelled_exception(err)):
            workflow.logger.info("episode body ended with %r after kill", err)


def _sensor_verdict(verdicts: Sequence[StepResult | str]) -> str:
    """The episode's watermark: the first step (or teardown) not judged in time,
    else ok ("" when nothing asked the sensor, e.g. histories from before it)."""
    said = [v if isinstance(v, str) else v.sensor for v in verdicts]
    said = [v for v in said if v]
    bad = [v for v in said if v not in ("ok", "off")]
    if bad:
        return bad[0]
    return "ok" if "ok" in said else (said[0] if said else "")


def _step_failed(result: StepResult) -> ApplicationError:
    return ApplicationError(
        f"step {result.index} `{result.cmd}` " + _step_failure(result),
        type="StepFailed",
        non_retryable=True,
    )


def _file_request(spec_file: FileSpec) -> WriteFileRequest:
    return WriteFileRequest(
        path=spec_file.path,
        content_b64=base64.b64encode(spec_file.content.encode()).decode(),
        mode=spec_file.mode,
    )


def _step_failure(result: StepResult) -> str:
    if result.interrupted:
        return f"interrupted: {result.interrupted}"
    return "timed out" if result.timed_out else f"exited {result.exit_code}"


def _outcome_of(err: ApplicationError) -> str:
    return {"IdleTimeout": "timed_out"}.get(err.type or "", "failed")
