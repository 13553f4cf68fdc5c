"""`corral tenant list`: each tenant's use against its quota."""

from __future__ import annotations

import click
from rich.table import Table

from corral.cli_common import Context, emit_json, out, pass_ctx, run_async


@click.group()
def tenant() -> None:
    """Tenants: rules and quotas from temporal-dev.yaml, use from the admission workflow."""


@tenant.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_ctx
@run_async
async def tenant_list(ctx: Context, as_json: bool) -> None:
    """Running and waiting episodes, CPU and memory of each tenant, against its quota."""
    from corral.ops.tenants import list_tenants

    rows = await list_tenants(ctx.config)
    if as_json:
        emit_json([row.model_dump(mode="json") for row in rows])
        return
    if not rows:
        out.print("no tenants declared (tenants: in temporal-dev.yaml) and none admitted")
        return
    table = Table("tenant", "episodes", "waiting", "cpu_cores", "memory_mb", "weight", "on quota")
    for row in rows:
        quota = row.quota
        table.add_row(
            row.tenant,
            _of(row.episodes, quota.max_episodes if quota else None),
            str(row.waiting),
            _of(row.cpu_cores, quota.cpu_cores if quota else None),
            _of(row.memory_mb, quota.memory_mb if quota else None),
            f"{quota.weight:g}" if quota else "",
            quota.on_quota if quota else "",
        )
    out.print(table)


def _of(used: float, limit: float | None) -> str:
    """`used / limit`, or `used` alone where there is no limit."""
    return f"{used:g} / {limit:g}" if limit is not None else f"{used:g}"


COMMANDS = [tenant]
