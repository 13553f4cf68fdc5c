"""A create cut off between Snapshots.Prepare and Containers.Create (a node killed
mid-provision) leaves a sandbox's rootfs snapshot with no container; the node's
reaper finds it by its label and removes it, and leaves live sandboxes alone."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable

import pytest

from sandbox._gen.containerd.api.services.snapshots.v1 import snapshots_pb2
from sandbox.client import SANDBOX_LABEL, Containerd
from sandbox.models import ImageInfo
from sandbox.sandbox import Sandbox

pytestmark = pytest.mark.integration


async def _cut_off_create(ctd: Containerd, busybox: ImageInfo) -> tuple[str, str]:
    """What a provision leaves when it dies right after preparing the rootfs
    (the snapshot, and the lease it was made under)."""
    sandbox_id = f"t-cut-{uuid.uuid4().hex[:10]}"
    conn = ctd.connection
    lease = await conn.create_lease("test-cut-off")
    await conn.snapshots.Prepare(
        snapshots_pb2.PrepareSnapshotRequest(
            snapshotter=conn.snapshotter,
            key=sandbox_id,
            parent=busybox.chain_id or "",
            labels={SANDBOX_LABEL: sandbox_id},
        ),
        metadata=conn.md(lease),
    )
    return sandbox_id, lease


async def test_a_cut_off_create_is_found_and_removed(
    ctd: Containerd, busybox: ImageInfo, make_sandbox: Callable[..., Awaitable[Sandbox]]
) -> None:
    live = await make_sandbox()
    orphan, lease = await _cut_off_create(ctd, busybox)
    try:
        containers = set(await ctd.container_ids())
        assert orphan not in containers
        found = await ctd.orphan_snapshots(containers, older_than_s=0)
        assert orphan in found and live.id not in found
        # Young ones are left to the provision that may still be making them.
        assert orphan not in await ctd.orphan_snapshots(containers, older_than_s=3600)
    finally:
        assert await ctd.destroy_sandbox(orphan)
        await ctd.connection.delete_lease(lease)
    assert orphan not in await ctd.snapshot_keys(active_only=True)
    assert orphan not in await ctd.orphan_snapshots(set(await ctd.container_ids()), 0)
