"""Idle time and hibernation: how long an interactive episode has been idle,
when hibernation is due, the snapshot that frees an idle sandbox, and the
wake that restores it (same node, or another one when its own was lost and
the snapshot is in a registry) before the next request runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities.node import NodeActivities
    from activities.snapshots import SnapshotActivities
    from contract.ids import hibernation_tag, snapshot_ref
    from contract.models import ProvisionInput, SnapshotInput, SnapshotResult, TeardownInput
    from workflows.episode_placement import EpisodePlacement
    from workflows.episode_support import PROVISION_ATTEMPTS
    from workflows.steps import surfaced


class EpisodeHibernation(EpisodePlacement):
    async def _take_snapshot(self, name: str | None, *, services: bool = True) -> SnapshotResult:
        episode = workflow.info().workflow_id
        ref = snapshot_ref(episode, name or f"s{len(self._s.snapshots) + 1}")
        result: SnapshotResult = await self._node_activity(
            SnapshotActivities.snapshot,
            SnapshotInput(
                sandbox_id=self._s.sandbox_id, ref=ref, episode_id=episode, services=services
            ),
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
            # Services restart from their images on wake (docs/fork.md): not snapshotted.
            tag = hibernation_tag(self._s.next_index)
            result = await self._take_snapshot(tag, services=False)
            await self._node_activity(
                NodeActivities.teardown, TeardownInput(sandbox_id=self._s.sandbox_id), timeout_s=120
            )
            self._s.hibernated_ref = result.ref
            self._s.hibernations.append(result.ref)
            self._set_state("hibernated")

    @contextlib.asynccontextmanager
    async def _request_turn(self, *, frozen_waits: bool = True) -> AsyncIterator[None]:
        """A request's turn at the sandbox: the episode is interactive, no other
        request runs (the lock), the sandbox is not frozen (unless the request
        may meet a frozen one: `frozen_waits=False`), the episode still takes
        requests, and a hibernated sandbox is awake again."""
        await self._wait_interactive()
        async with self._lock:
            if frozen_waits:
                await self._wait_unfrozen()
            self._check_open()
            await surfaced(self._wake())
            yield

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
