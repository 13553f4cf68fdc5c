"""The node's janitor: `corral.reap_orphans`.

Removes the sandboxes whose episode is closed or unknown to Temporal
(terminated, lost with its history), the rootfs snapshots of creates a crash
cut off before their container existed, and the scratch of a userns remap a
crash cut off. Run by the janitor workflow's schedule and by the node worker
before it polls (no grace then: nothing provisions there yet). Sandboxes
younger than the grace period are left alone: their provision may be under way.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from activities.glue import heartbeat, mapped
from contract.labels import OWNER_LABEL, SANDBOX_LABEL
from contract.models import ReapInput, ReapResult, TeardownInput, TeardownResult
from sandbox.runtime import SandboxRuntime

Teardown = Callable[[TeardownInput], Awaitable[TeardownResult]]


class Reaper:
    def __init__(
        self, node: str, runtime: SandboxRuntime, temporal: Client | None, teardown: Teardown
    ) -> None:
        self.node = node
        self._runtime = runtime
        self._temporal = temporal
        self._teardown = teardown

    async def reap_orphans(self, input: ReapInput) -> ReapResult:
        """Remove sandboxes whose workflow is closed or unknown (terminated, lost),
        the rootfs snapshots of creates a crash cut off before their container,
        and the scratch of an image remap a crash cut off."""
        if self._temporal is None:
            raise ApplicationError("node worker has no Temporal client", non_retryable=True)
        sandboxes = await mapped(self._runtime.list_sandboxes({SANDBOX_LABEL: "1"}))
        removed: list[str] = []
        now = datetime.now(UTC)
        for info in sandboxes:
            heartbeat(info.id)  # also run by the node worker at start, outside an activity
            workflow_id = info.labels.get(OWNER_LABEL)
            created = as_utc(info.created_at)
            young = created is not None and (now - created).total_seconds() < input.grace_s
            if not workflow_id or young or await self._workflow_open(workflow_id):
                continue
            await self._teardown(TeardownInput(sandbox_id=info.id))
            removed.append(info.id)
        known = {info.id for info in sandboxes}
        for key in await mapped(self._runtime.orphan_snapshots(known, input.grace_s)):
            await self._teardown(TeardownInput(sandbox_id=key))
            removed.append(key)
        removed += await mapped(self._runtime.clear_stale_remaps(input.grace_s))
        return ReapResult(node=self.node, checked=len(sandboxes), removed=removed)

    async def _workflow_open(self, workflow_id: str) -> bool:
        assert self._temporal is not None
        try:
            desc = await self._temporal.get_workflow_handle(workflow_id).describe()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return False
            raise
        return desc.status is not None and desc.status.name == "RUNNING"


def as_utc(moment: datetime | None) -> datetime | None:
    """containerd's timestamps arrive naive (protobuf `ToDatetime`) but are UTC."""
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)
