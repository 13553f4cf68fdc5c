"""Admission: tenant rules, quotas and weighted fair order.

Tenants are declared in `temporal-dev.yaml` (`tenants:`, docs/tenants.md).
A spec that breaks a tenant's rules (image, egress, lifetime, a resource
larger than the whole quota) is refused before anything is made: by the SDK,
and again here, authoritatively. Episodes of a tenant with a quota ask the
singleton `AdmissionWorkflow` (id `corral-admission`) for room; it answers each
with an `admission` signal: `admitted`, `waiting` (with the reason: the quota
or the cluster's room that is taken) or `rejected` (the tenant said
`on_quota: reject`). Waiting episodes start as room appears, first-come within
a tenant and in weighted fair order across tenants (start-time fair queuing:
each admission advances its tenant's virtual time by 1/weight, and the tenant
with the least virtual time goes next).

Episodes of tenants without a quota never come here (no signals, no tasks).

`AdmissionQueue` is the pure, deterministic queue logic (unit-tested);
`AdmissionWorkflow` wraps it; `Admission` is the episode's side.
"""

from __future__ import annotations

import contextlib
import fnmatch
import ipaddress
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, Field
from temporalio import workflow
from temporalio.exceptions import ApplicationError, FailureError, WorkflowAlreadyStartedError

with workflow.unsafe.imports_passed_through():
    from contract.models import AdmissionPolicy, ClusterRoom, EpisodeSpec, TenantConfig

ADMISSION_WORKFLOW_ID = "corral-admission"
DECISION_SIGNAL = "admission"  # on EpisodeWorkflow
REJECTED_ERROR_TYPE = "EpisodeRejected"
# Continue-as-new well before the history gets slow to replay.
MAX_HISTORY_EVENTS = 5_000


class AdmissionRequest(BaseModel):
    episode_id: str
    tenant: str
    policy: AdmissionPolicy
    cpu_cores: float
    memory_mb: int
    spec: EpisodeSpec | None = None  # checked against the tenant's rules here too


class AdmissionRelease(BaseModel):
    episode_id: str


class AdmissionDecision(BaseModel):
    status: Literal["waiting", "admitted", "rejected"]
    reason: str = ""


class Grant(BaseModel):
    tenant: str
    cpu_cores: float
    memory_mb: int


class TenantUsage(BaseModel):
    """One row of `corral tenant list`: use against quota."""

    tenant: str
    episodes: int = 0
    waiting: int = 0
    cpu_cores: float = 0.0
    memory_mb: int = 0
    quota: TenantConfig | None = None


class AdmissionState(BaseModel):
    """Everything the queue knows; carried across continue-as-new."""

    tenants: dict[str, TenantConfig] = Field(default_factory=dict)
    cluster: ClusterRoom = Field(default_factory=ClusterRoom)
    running: dict[str, Grant] = Field(default_factory=dict)
    waiting: list[AdmissionRequest] = Field(default_factory=list)
    virtual_time: dict[str, float] = Field(default_factory=dict)
    clock: float = 0.0  # virtual time of the last admission


Decisions = list[tuple[str, AdmissionDecision]]


# --------------------------------------------------------------------------
# Static rules
# --------------------------------------------------------------------------


def tenant_rule_violation(spec: EpisodeSpec, tenant: TenantConfig) -> str | None:
    """Why `spec` breaks a rule of its tenant (one line), or None."""
    name = spec.tenant
    if not any(fnmatch.fnmatchcase(spec.image, glob) for glob in tenant.images):
        return f"tenant '{name}' does not allow image '{spec.image}' (allowed: {tenant.images})"
    lifetime = spec.timeouts.max_lifetime_s
    if tenant.max_lifetime_s is not None and lifetime > tenant.max_lifetime_s:
        return (
            f"tenant '{name}' allows a lifetime of at most {tenant.max_lifetime_s:g} s "
            f"(timeouts.max_lifetime_s is {lifetime:g})"
        )
    for rule in spec.network.egress:
        if not _egress_allowed(rule.cidr, tenant.egress):
            return (
                f"tenant '{name}' does not allow egress to {rule.cidr} (allowed: {tenant.egress})"
            )
    if not spec.user_namespace and not tenant.allow_no_user_namespace:
        return f"tenant '{name}' requires a user namespace"
    return _larger_than_quota(spec, tenant)


def _egress_allowed(cidr: str, allowed: list[str] | None) -> bool:
    if allowed is None:
        return True
    try:
        wanted = ipaddress.ip_network(cidr, strict=False)
        return any(
            wanted.version == net.version and wanted.subnet_of(net)  # type: ignore[arg-type]
            for net in (ipaddress.ip_network(a, strict=False) for a in allowed)
        )
    except ValueError:
        return False


def _larger_than_quota(spec: EpisodeSpec, tenant: TenantConfig) -> str | None:
    """A spec that could never fit its tenant's whole quota waits forever: refuse it."""
    name, resources = spec.tenant, spec.resources
    if tenant.cpu_cores is not None and resources.cpu_cores > tenant.cpu_cores:
        return (
            f"tenant '{name}' has a quota of {tenant.cpu_cores:g} cpu_cores "
            f"(the spec asks for {resources.cpu_cores:g})"
        )
    if tenant.memory_mb is not None and resources.memory_mb > tenant.memory_mb:
        return (
            f"tenant '{name}' has a quota of {tenant.memory_mb} MiB of memory "
            f"(the spec asks for {resources.memory_mb})"
        )
    return None


def needs_admission(policy: AdmissionPolicy | None) -> bool:
    return policy is not None and policy.tenant.has_quota()


# --------------------------------------------------------------------------
# The queue (pure, deterministic)
# --------------------------------------------------------------------------


class AdmissionQueue:
    """Quotas and fair order over plain data; every call returns the decisions to send."""

    def __init__(self, state: AdmissionState | None = None) -> None:
        self.state = state or AdmissionState()

    def request(self, ask: AdmissionRequest) -> Decisions:
        state = self.state
        if ask.episode_id in state.running:  # a repeated request: answer it again
            return [(ask.episode_id, AdmissionDecision(status="admitted"))]
        if any(w.episode_id == ask.episode_id for w in state.waiting):
            return []
        state.tenants[ask.tenant] = ask.policy.tenant
        state.cluster = ask.policy.cluster
        broken = tenant_rule_violation(ask.spec, ask.policy.tenant) if ask.spec else None
        if broken:
            return [(ask.episode_id, AdmissionDecision(status="rejected", reason=broken))]
        if not self._active(ask.tenant):  # no credit for the time it was away
            state.virtual_time[ask.tenant] = max(
                state.virtual_time.get(ask.tenant, 0.0), state.clock
            )
        state.waiting.append(ask)
        decisions = self._dispatch()
        if any(episode_id == ask.episode_id for episode_id, _ in decisions):
            return decisions
        return [*decisions, self._not_now(ask)]

    def release(self, episode_id: str) -> Decisions:
        """An episode ended (or gave up waiting): its room goes to the next in line."""
        self.state.running.pop(episode_id, None)
        self.state.waiting = [w for w in self.state.waiting if w.episode_id != episode_id]
        return self._dispatch()

    def usage(self) -> list[TenantUsage]:
        rows = {
            name: TenantUsage(tenant=name, quota=cfg) for name, cfg in self.state.tenants.items()
        }
        for grant in self.state.running.values():
            row = rows.setdefault(grant.tenant, TenantUsage(tenant=grant.tenant))
            row.episodes += 1
            row.cpu_cores = round(row.cpu_cores + grant.cpu_cores, 3)
            row.memory_mb += grant.memory_mb
        for ask in self.state.waiting:
            rows.setdefault(ask.tenant, TenantUsage(tenant=ask.tenant)).waiting += 1
        return sorted(rows.values(), key=lambda row: row.tenant)

    # ------------------------------------------------------------ internals
    def _not_now(self, ask: AdmissionRequest) -> tuple[str, AdmissionDecision]:
        reason = self._blocked(ask) or f"behind an earlier episode of tenant '{ask.tenant}'"
        if ask.policy.tenant.on_quota == "reject":
            self.state.waiting.remove(ask)
            return ask.episode_id, AdmissionDecision(status="rejected", reason=reason)
        return ask.episode_id, AdmissionDecision(status="waiting", reason=reason)

    def _dispatch(self) -> Decisions:
        """Admit waiting episodes while any fits: the fitting head of line of the
        tenant with the least virtual time goes first."""
        decisions: Decisions = []
        while True:
            heads = [ask for ask in self._heads() if self._blocked(ask) is None]
            if not heads:
                return decisions
            ask = min(heads, key=lambda a: self.state.virtual_time.get(a.tenant, 0.0))
            self._admit(ask)
            decisions.append((ask.episode_id, AdmissionDecision(status="admitted")))

    def _heads(self) -> list[AdmissionRequest]:
        """Each tenant's first waiting episode (first come, first served within a tenant)."""
        seen: dict[str, AdmissionRequest] = {}
        for ask in self.state.waiting:
            seen.setdefault(ask.tenant, ask)
        return list(seen.values())

    def _admit(self, ask: AdmissionRequest) -> None:
        state = self.state
        state.waiting.remove(ask)
        state.running[ask.episode_id] = Grant(
            tenant=ask.tenant, cpu_cores=ask.cpu_cores, memory_mb=ask.memory_mb
        )
        start = state.virtual_time.get(ask.tenant, 0.0)
        state.clock = max(state.clock, start)
        state.virtual_time[ask.tenant] = start + 1.0 / state.tenants[ask.tenant].weight

    def _active(self, tenant: str) -> bool:
        state = self.state
        return any(w.tenant == tenant for w in state.waiting) or any(
            g.tenant == tenant for g in state.running.values()
        )

    def _blocked(self, ask: AdmissionRequest) -> str | None:
        """The quota or room that one more episode like `ask` would exceed, or None."""
        quota = self.state.tenants[ask.tenant]
        mine = [g for g in self.state.running.values() if g.tenant == ask.tenant]
        name = f"tenant '{ask.tenant}'"
        if quota.max_episodes is not None and len(mine) + 1 > quota.max_episodes:
            return f"{name} is at its quota of {quota.max_episodes} concurrent episodes"
        used_cpu = sum(g.cpu_cores for g in mine)
        if quota.cpu_cores is not None and used_cpu + ask.cpu_cores > quota.cpu_cores:
            return (
                f"{name} is at its quota of {quota.cpu_cores:g} cpu_cores "
                f"({used_cpu:g} in use, {ask.cpu_cores:g} asked)"
            )
        used_mem = sum(g.memory_mb for g in mine)
        if quota.memory_mb is not None and used_mem + ask.memory_mb > quota.memory_mb:
            return (
                f"{name} is at its quota of {quota.memory_mb} MiB of memory "
                f"({used_mem} in use, {ask.memory_mb} asked)"
            )
        return self._cluster_full(ask)

    def _cluster_full(self, ask: AdmissionRequest) -> str | None:
        room, running = self.state.cluster, self.state.running.values()
        if room.episodes is not None and len(running) + 1 > room.episodes:
            return f"no room on the nodes: {room.episodes} episodes with a quota are running"
        cpu = sum(g.cpu_cores for g in running)
        if room.cpu_cores is not None and cpu + ask.cpu_cores > room.cpu_cores:
            return f"no room on the nodes: {cpu:g} of {room.cpu_cores:g} cpu_cores are committed"
        return None


# --------------------------------------------------------------------------
# The workflow
# --------------------------------------------------------------------------


@workflow.defn
class AdmissionWorkflow:
    """The singleton that holds the queue; episodes signal it, it signals them back."""

    @workflow.init
    def __init__(self, state: AdmissionState) -> None:
        self._queue = AdmissionQueue(state)
        self._outbox: Decisions = []

    @workflow.run
    async def run(self, state: AdmissionState) -> None:
        while True:
            await workflow.wait_condition(lambda: bool(self._outbox) or self._history_long())
            while self._outbox:
                await self._send(*self._outbox.pop(0))
            if self._history_long():
                await workflow.wait_condition(workflow.all_handlers_finished)
                if not self._outbox:
                    workflow.continue_as_new(self._queue.state)

    @workflow.signal
    def request(self, ask: AdmissionRequest) -> None:
        self._outbox += self._queue.request(ask)

    @workflow.signal
    def release(self, release: AdmissionRelease) -> None:
        self._outbox += self._queue.release(release.episode_id)

    @workflow.query
    def usage(self) -> list[TenantUsage]:
        return self._queue.usage()

    async def _send(self, episode_id: str, decision: AdmissionDecision) -> None:
        try:
            await workflow.get_external_workflow_handle(episode_id).signal(
                DECISION_SIGNAL, decision
            )
        except FailureError:
            # The episode is gone (cancelled or terminated while it waited): its room is free.
            workflow.logger.info("episode %s is gone; releasing its admission", episode_id)
            self._outbox += self._queue.release(episode_id)

    def _history_long(self) -> bool:
        info = workflow.info()
        return (
            info.is_continue_as_new_suggested()
            or info.get_current_history_length() > MAX_HISTORY_EVENTS
        )


# --------------------------------------------------------------------------
# The episode's side
# --------------------------------------------------------------------------


class Admission:
    """Held by `EpisodeWorkflow`: `admit` before placing, `release` when it closes.

    The episode's `admission` signal handler passes each decision to `decided`.
    `held` (whether this episode holds room) is carried across continue-as-new.
    """

    def __init__(self, held: bool = False) -> None:
        self.held = held
        self._asked = held
        self._decisions: list[AdmissionDecision] = []

    def decided(self, decision: AdmissionDecision) -> None:
        self._decisions.append(decision)

    async def admit(
        self, spec: EpisodeSpec, policy: AdmissionPolicy | None, on_wait: Callable[[str], None]
    ) -> None:
        """Return once admitted; raise `EpisodeRejected` naming the quota or rule."""
        if self.held or policy is None or not needs_admission(policy):
            return
        ask = AdmissionRequest(
            episode_id=workflow.info().workflow_id,
            tenant=spec.tenant,
            policy=policy,
            cpu_cores=spec.resources.cpu_cores,
            memory_mb=spec.resources.memory_mb,
            spec=spec,
        )
        self._asked = True
        await _signal_admission("request", ask)
        while not self.held:
            await workflow.wait_condition(lambda: bool(self._decisions))
            decision = self._decisions.pop(0)
            if decision.status == "rejected":
                self._asked = False
                raise ApplicationError(
                    f"episode rejected: {decision.reason}",
                    type=REJECTED_ERROR_TYPE,
                    non_retryable=True,
                )
            if decision.status == "waiting":
                on_wait(decision.reason)
            self.held = decision.status == "admitted"

    async def release(self) -> None:
        """Give the room back (or stop waiting); a no-op when nothing was asked."""
        if not self._asked:
            return
        self._asked = self.held = False
        await _signal_admission("release", AdmissionRelease(episode_id=workflow.info().workflow_id))


async def _signal_admission(signal: str, arg: AdmissionRequest | AdmissionRelease) -> None:
    """Signal the admission workflow, starting it first if it does not run yet."""
    handle = workflow.get_external_workflow_handle(ADMISSION_WORKFLOW_ID)
    try:
        await handle.signal(signal, arg)
        return
    except FailureError:
        pass  # not running yet (or any more)
    with contextlib.suppress(WorkflowAlreadyStartedError):  # another episode started it
        await workflow.start_child_workflow(
            AdmissionWorkflow.run,
            AdmissionState(),
            id=ADMISSION_WORKFLOW_ID,
            parent_close_policy=workflow.ParentClosePolicy.ABANDON,
        )
    await handle.signal(signal, arg)
