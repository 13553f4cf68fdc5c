"""Tenants as the stack config declares them: rules before start, admission policy.

`prepare_for_tenant` is what `Corral.start_episode` runs before anything is
created: it fills the tenant's lifetime into a spec that left it unset,
refuses a spec that breaks a rule (one line naming the rule), and returns the
`AdmissionPolicy` the episode carries when its tenant has a quota (None
otherwise: such episodes never touch the admission workflow). The same rules
are checked again, authoritatively, in the admission workflow.
"""

from __future__ import annotations

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from activities.capacity import node_capacity
from contract.config import StackConfig
from contract.errors import CorralError
from contract.models import AdmissionPolicy, ClusterRoom, EpisodeSpec, TenantConfig
from workflows.admission import (
    ADMISSION_WORKFLOW_ID,
    AdmissionWorkflow,
    TenantUsage,
    tenant_rule_violation,
)


class TenantRuleViolation(CorralError):
    """The spec breaks a rule of its tenant; the message names the rule."""


def check_tenant_rules(spec: EpisodeSpec, tenant: TenantConfig | None) -> None:
    """Raise `TenantRuleViolation` if `spec` breaks a rule of `tenant`; an undeclared
    tenant has the defaults (anything goes but dropping the user namespace)."""
    violation = tenant_rule_violation(spec, tenant or TenantConfig())
    if violation:
        raise TenantRuleViolation(violation)


def with_tenant_defaults(spec: EpisodeSpec, tenant: TenantConfig | None) -> EpisodeSpec:
    """A spec that did not set its lifetime gets the tenant's maximum."""
    if tenant is None or tenant.max_lifetime_s is None:
        return spec
    if "max_lifetime_s" in spec.timeouts.model_fields_set:
        return spec
    timeouts = spec.timeouts.model_copy(update={"max_lifetime_s": tenant.max_lifetime_s})
    return spec.model_copy(update={"timeouts": timeouts})


def cluster_room(config: StackConfig) -> ClusterRoom:
    """The nodes' nominal room: every node's budget, from config or this machine."""
    capacity = node_capacity(config.nodes.budget)
    nodes = len(config.node_names())
    return ClusterRoom(
        episodes=capacity.max_sandboxes * nodes,
        cpu_cores=capacity.cores * capacity.overcommit * nodes,
    )


def prepare_for_tenant(
    config: StackConfig, spec: EpisodeSpec
) -> tuple[EpisodeSpec, AdmissionPolicy | None]:
    """The spec with the tenant's defaults, checked, and its admission policy (or None)."""
    tenant = config.tenants.get(spec.tenant)
    spec = with_tenant_defaults(spec, tenant)
    check_tenant_rules(spec, tenant)
    if tenant is None or not tenant.has_quota():
        return spec, None
    return spec, AdmissionPolicy(tenant=tenant, cluster=cluster_room(config))


async def tenant_usage(client: Client, config: StackConfig) -> list[TenantUsage]:
    """Each declared tenant (and any the admission workflow has seen) with its use
    and its configured quota; zero use while no episode with a quota ran yet."""
    try:
        seen: list[TenantUsage] = await client.get_workflow_handle(ADMISSION_WORKFLOW_ID).query(
            AdmissionWorkflow.usage
        )
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            raise
        seen = []
    rows = {row.tenant: row for row in seen}
    for name, tenant in config.tenants.items():
        row = rows.setdefault(name, TenantUsage(tenant=name))
        row.quota = tenant  # the configuration is the truth; admission saw the last episode's
    return sorted(rows.values(), key=lambda row: row.tenant)
