"""A create cut off between Snapshots.Prepare and Containers.Create (a node killed
mid-provision) leaves a sandbox's rootfs snapshot with no container; the node's
reaper finds it by its label and removes it, and leaves live sandboxes alone."""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from contract.labels import SANDBOX_LABEL
from sandbox import userns
from sandbox._gen.containerd.api.services.snapshots.v1 import snapshots_pb2
from sandbox.client import Containerd
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


async def test_a_remap_cut_off_mid_shift_is_cleared(ctd: Containerd, busybox: ImageInfo) -> None:
    """A node killed while it shifted an image into a userns range leaves the
    scratch snapshot, mounted: the reaper unmounts and removes both, but not
    while they are young (a remap under way)."""
    remapped = f"{busybox.chain_id}@userns-{4_000_000_000 + uuid.uuid4().int % 10**6}-65536"
    scratch_key = userns.scratch_key(remapped)
    conn = ctd.connection
    lease = await conn.create_lease("test-cut-off-remap")
    resp = await conn.snapshots.Prepare(
        snapshots_pb2.PrepareSnapshotRequest(
            snapshotter=conn.snapshotter, key=scratch_key, parent=busybox.chain_id or ""
        ),
        metadata=conn.md(lease),
    )
    scratch_dir = ctd.workspace_root.parent / "remap"
    scratch_dir.mkdir(parents=True, exist_ok=True)
    target = Path(tempfile.mkdtemp(prefix=userns.SCRATCH_MOUNT_PREFIX, dir=scratch_dir))
    subprocess.run(userns.mount_argv(resp.mounts, target), check=True)
    try:
        assert await ctd.clear_stale_remaps(older_than_s=3600) == []
        assert os.path.ismount(target)
        assert scratch_key in await ctd.clear_stale_remaps(older_than_s=0)
        assert not target.exists()
        assert scratch_key not in await ctd.snapshot_keys(active_only=True)
    finally:
        if os.path.ismount(target):
            subprocess.run(["umount", str(target)], check=False)
        with contextlib.suppress(OSError):
            target.rmdir()
        await ctd.destroy_sandbox(scratch_key)
        await conn.delete_lease(lease)
