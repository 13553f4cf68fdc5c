"""Staged snapshots on real containerd (sandbox/snapshot.py): children start from
the committed copy before the layer exists; the image is made whole after,
with the same content; what needs the layer (a sandbox in another uid range, a
snapshot of a child) waits for it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from activities.snapshots import SnapshotActivities
from contract.labels import LAYER_BYTES_LABEL, STAGED_LABEL, STAGED_LEASE_LABEL
from sandbox.client import Containerd
from sandbox.sandbox import Sandbox
from sandbox.snapshot import commit_sandbox, materialize, stage_sandbox

pytestmark = pytest.mark.integration

MakeSandbox = Callable[..., Awaitable[Sandbox]]
LOOK = "ls /bin/ls 2>&1; ls /usr; cat /root/s; stat -c %u /root/s"


async def changed_sandbox(make_sandbox: MakeSandbox) -> Sandbox:
    """A sandbox with a file written, one deleted and a directory replaced."""
    box = await make_sandbox()
    changed = await box.exec(
        "rm /bin/ls && rm -rf /usr && mkdir /usr && echo new > /usr/only && echo s > /root/s"
    )
    assert changed.ok, changed.stderr
    return box


def assert_changes_seen(seen: str, owner: str | None = "0") -> None:
    lines = seen.splitlines()
    assert lines[0].endswith("No such file or directory"), lines
    assert lines[1:3] == ["only", "s"], lines
    if owner is not None:
        assert lines[3] == owner, lines


async def test_children_start_from_a_staged_snapshot_before_its_layer_exists(
    ctd: Containerd, make_sandbox: MakeSandbox
) -> None:
    box = await changed_sandbox(make_sandbox)
    staged = await stage_sandbox(ctd.connection, ctd.images, box.id, "staged-snap:1", {})
    try:
        assert STAGED_LABEL in staged.labels and LAYER_BYTES_LABEL not in staged.labels
        early = await make_sandbox(image=staged.name)
        assert_changes_seen((await early.exec(LOOK)).stdout)

        whole = await materialize(ctd.connection, ctd.images, staged.name)
        assert STAGED_LABEL not in whole.labels and STAGED_LEASE_LABEL not in whole.labels
        # The layer holds the changes only, not a re-owned copy of the image.
        assert 0 < int(whole.labels[LAYER_BYTES_LABEL]) < 64 * 1024
        suffix = ctd.uid_pool.mapping(0).snapshot_suffix
        assert await ctd.images._has_snapshot(f"{whole.chain_id}{suffix}")
        assert whole.chain_id != staged.chain_id
        # The staged copy's lease is gone: the whole image's chain holds it now.
        assert staged.labels[STAGED_LEASE_LABEL] not in await ctd.lease_ids()

        late = await make_sandbox(image=whole.name)
        assert_changes_seen((await late.exec(LOOK)).stdout)
        # Without a user namespace the layer itself is unpacked: same changes.
        host_owner = str(ctd.uid_pool.mapping(0).host_id)
        unmapped = await make_sandbox(image=whole.name, user_namespace=False)
        assert_changes_seen((await unmapped.exec(LOOK)).stdout, owner=host_owner)
    finally:
        await ctd.images.remove(staged.name)


async def test_a_snapshot_of_a_child_stacks_on_the_whole_parent(
    ctd: Containerd, make_sandbox: MakeSandbox
) -> None:
    box = await changed_sandbox(make_sandbox)
    staged = await stage_sandbox(ctd.connection, ctd.images, box.id, "staged-snap:2", {})
    made: list[str] = [staged.name]
    try:
        child = await make_sandbox(image=staged.name)
        assert (await child.exec("echo g > /root/g")).ok
        # The child's commit waits for its parent's layer, then stacks its own on it.
        committing = asyncio.create_task(
            commit_sandbox(ctd.connection, ctd.images, child.id, "staged-snap:3", {})
        )
        await asyncio.sleep(0.3)
        assert not committing.done()
        await materialize(ctd.connection, ctd.images, staged.name)
        grand_image = await committing
        made.append(grand_image.name)
        grand = await make_sandbox(image=grand_image.name, user_namespace=False)
        seen = await grand.exec("cat /root/s /root/g /usr/only; ls /bin/ls 2>&1")
        assert seen.stdout.splitlines()[:3] == ["s", "g", "new"], seen.stdout
        assert seen.stdout.rstrip().endswith("No such file or directory")
    finally:
        for name in reversed(made):
            await ctd.images.remove(name)


async def test_a_child_in_another_uid_range_waits_for_the_whole_image(
    ctd: Containerd, make_sandbox: MakeSandbox
) -> None:
    box = await changed_sandbox(make_sandbox)
    staged = await stage_sandbox(ctd.connection, ctd.images, box.id, "staged-snap:4", {})
    try:
        other_range = asyncio.create_task(make_sandbox(image=staged.name, userns_range=1))
        await asyncio.sleep(0.3)
        assert not other_range.done()  # the copy is chowned for range 0: it needs the layer
        await materialize(ctd.connection, ctd.images, staged.name)
        child = await other_range
        # Layers record host-side owners (docs/fork.md, "Left out"): not checked here.
        assert_changes_seen((await child.exec(LOOK)).stdout, owner=None)
    finally:
        await ctd.images.remove(staged.name)


async def test_a_restarted_node_worker_makes_the_staged_images_it_finds_whole(
    ctd: Containerd, make_sandbox: MakeSandbox
) -> None:
    """What a worker that died before its background write left is finished by
    the next one at its start (workers/node_worker.py calls `resume_staged`)."""
    box = await changed_sandbox(make_sandbox)
    staged = await stage_sandbox(ctd.connection, ctd.images, box.id, "staged-snap:5", {})
    try:
        snapshots = SnapshotActivities("node-1", ctd, {})
        assert staged.name in await snapshots.resume_staged()
        await snapshots.settled()
        whole = await ctd.images.get(staged.name)
        assert STAGED_LABEL not in whole.labels and int(whole.labels[LAYER_BYTES_LABEL]) > 0
        child = await make_sandbox(image=whole.name, user_namespace=False)
        host_owner = str(ctd.uid_pool.mapping(0).host_id)
        assert_changes_seen((await child.exec(LOOK)).stdout, owner=host_owner)
    finally:
        await ctd.images.remove(staged.name)
