"""Tenants (`corral tenant list`): each one's use against its quota."""

from __future__ import annotations

from contract.config import StackConfig
from workers.temporal import connect
from workers.tenants import tenant_usage
from workflows.admission import TenantUsage


async def list_tenants(config: StackConfig) -> list[TenantUsage]:
    """Every tenant declared in the stack's config, and any the admission workflow
    has seen, sorted by name: running and waiting episodes, CPU and memory in use,
    and the configured quota (None: no quota). Zero use while no episode with a
    quota has run yet."""
    return await tenant_usage(await connect(config), config)
