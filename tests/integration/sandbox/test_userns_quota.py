"""User namespaces and disk quotas on real containerd: the remapped image copy, files
written through the API, snapshots of a user-namespaced sandbox, a node without quotas."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from contract.errors import InvalidSpec
from sandbox import userns
from sandbox.client import Containerd
from sandbox.daemon import ContainerdDaemon
from sandbox.models import ImageInfo, SandboxSpec
from sandbox.quota import SNAPSHOTTER_DIR
from sandbox.sandbox import Sandbox
from sandbox.snapshot import commit_sandbox

pytestmark = pytest.mark.integration

MakeSandbox = Callable[..., Awaitable[Sandbox]]


async def owner_on_host(box: Sandbox, path: str) -> int:
    """uid of ``path`` in the sandbox's rootfs, as the host sees it."""
    return os.stat(await box.root_path() / path.lstrip("/")).st_uid


async def test_one_remapped_copy_per_range(
    ctd: Containerd, busybox: ImageInfo, make_sandbox: MakeSandbox
) -> None:
    first, second = await make_sandbox(), await make_sandbox()
    other = await make_sandbox(userns_range=1)
    remapped = [k for k in await ctd.snapshot_keys() if k.startswith(f"{busybox.chain_id}@")]
    pool = ctd.uid_pool
    assert sorted(remapped) == sorted(
        f"{busybox.chain_id}{pool.mapping(i).snapshot_suffix}" for i in (0, 1)
    )
    for box in (first, second, other):
        assert (await box.exec("id -u; stat -c %u /bin/busybox /")).stdout == "0\n0\n0\n"
    assert await owner_on_host(first, "/bin/busybox") == pool.mapping(0).host_id
    assert await owner_on_host(other, "/bin/busybox") == pool.mapping(1).host_id


async def test_files_through_the_api_belong_to_the_sandbox_user(
    ctd: Containerd, make_sandbox: MakeSandbox
) -> None:
    box = await make_sandbox(workspace_mb=8)
    await box.write_file("/workspace/a.txt", b"a")
    await box.write_file("/etc/b.txt", b"b")
    assert await box.read_file("/etc/b.txt") == b"b"
    assert (await box.exec("stat -c %u /workspace/a.txt /etc/b.txt")).stdout == "0\n0\n"
    assert await owner_on_host(box, "/etc/b.txt") == ctd.uid_pool.mapping(0).host_id
    # A non-root sandbox user owns its workspace, inside and (shifted) on the host.
    agent = await make_sandbox(workspace_mb=8, user="1000:1000")
    assert (await agent.exec("echo x > /workspace/u && stat -c %u /workspace/u")).stdout == "1000\n"
    volume = ctd.workspace_root / agent.id / "u"
    assert volume.stat().st_uid == ctd.uid_pool.mapping(0).to_host(1000)


async def test_snapshot_of_a_user_namespaced_sandbox_holds_only_its_changes(
    ctd: Containerd, make_sandbox: MakeSandbox
) -> None:
    box = await make_sandbox()
    await box.write_file("/root/state.txt", b"kept")
    image = await commit_sandbox(
        ctd.connection, ctd.images, box.id, "corral.local/defense-snap:1", {}
    )
    try:
        # The layer holds one small file, not a re-owned copy of the whole image.
        assert int(image.labels["corral.snapshot.layer_bytes"]) < 64 * 1024
        child = await make_sandbox(image=image.name)
        assert (
            await child.exec("cat /root/state.txt; stat -c %u /root/state.txt /bin/busybox")
        ).stdout == "kept0\n0\n"
    finally:
        await ctd.images.remove(image.name)


async def test_snapshot_children_start_on_a_ready_copy_with_deletions_kept(
    ctd: Containerd, make_sandbox: MakeSandbox
) -> None:
    """The commit copies the writable layer onto the sandbox's own (remapped)
    parent: a child of the same range needs no chowned copy of its own, and
    deletions (whiteouts) and replaced directories (opaque) come through, as
    they do for a child without a user namespace, which unpacks the layer."""
    box = await make_sandbox()
    changed = await box.exec(
        "rm /bin/ls && rm -rf /usr && mkdir /usr && echo new > /usr/only && echo s > /root/s"
    )
    assert changed.ok, changed.stderr
    image = await commit_sandbox(
        ctd.connection, ctd.images, box.id, "corral.local/defense-snap:2", {}
    )
    try:
        remapped = image.chain_id + ctd.uid_pool.mapping(0).snapshot_suffix
        assert await ctd.images._has_snapshot(remapped)
        look = "ls /bin/ls 2>&1; ls /usr; cat /root/s; stat -c %u /root/s"
        # Without a user namespace the layer's host-side owner shows (docs/fork.md).
        host_owner = str(ctd.uid_pool.mapping(0).host_id)
        for fields, owner in (({}, "0"), ({"user_namespace": False}, host_owner)):
            child = await make_sandbox(image=image.name, **fields)
            seen = (await child.exec(look)).stdout.splitlines()
            assert seen[0].endswith("No such file or directory"), (fields, seen)
            assert seen[1:] == ["only", "s", owner], (fields, seen)
    finally:
        await ctd.images.remove(image.name)


async def test_disk_quota_needs_the_quota_filesystem(tmp_path: Path, busybox: ImageInfo) -> None:
    """A node whose snapshotter dir predates quotas refuses disk_mb, naming the way out."""
    daemon = ContainerdDaemon(tmp_path / "noquota")
    legacy = daemon.root_dir / "root" / SNAPSHOTTER_DIR
    legacy.mkdir(parents=True, exist_ok=True)
    (legacy / "metadata.db").touch()  # a snapshotter that has been used
    await daemon.start()
    try:
        async with await Containerd.connect(daemon.socket, namespace="noquota") as client:
            with pytest.raises(InvalidSpec, match=r"disk_mb 1024: .* set disk_mb to None"):
                await client.create_sandbox("nq-1", SandboxSpec(image="busybox"))
            assert await client.container_ids() == []
            assert await client.snapshot_keys() == []
    finally:
        await daemon.stop(kill_shims=True)


async def test_sensor_mapping_reads_the_sandbox_view(
    ctd: Containerd, make_sandbox: MakeSandbox
) -> None:
    """What the sensor uses to report user.uid as the sandbox sees it (0 for its root)."""
    mapped, host_root = await make_sandbox(), await make_sandbox(user_namespace=False)
    pids = {}
    for box in (mapped, host_root):
        info = next(i for i in await ctd.list_sandboxes() if i.id == box.id)
        assert info.pid is not None
        pids[box.id] = info.pid
    maps = userns.read_mappings(pids[mapped.id])
    assert maps is not None
    host_id = ctd.uid_pool.mapping(0).host_id
    assert userns.id_inside(maps[0], host_id) == 0
    assert userns.id_inside(maps[1], host_id + 1000) == 1000
    assert userns.id_inside(maps[0], 0) == userns.OVERFLOW_ID  # host root is unmapped inside
    identity = userns.read_mappings(pids[host_root.id])
    assert identity is not None and userns.id_inside(identity[0], 0) == 0


async def test_remapped_copies_live_as_long_as_their_image(
    ctd: Containerd, busybox: ImageInfo, make_sandbox: MakeSandbox, tmp_path: Path
) -> None:
    from sandbox.oci_archive import build_busybox_rootfs, write_oci_archive

    rootfs = build_busybox_rootfs(tmp_path / "rootfs")
    (rootfs / "etc" / "marker").write_text("distinct chain\n")
    name = "corral.local/defense-gc:1"
    images = await ctd.images.import_archive(write_oci_archive(tmp_path / "i.tar", [rootfs], name))
    image = next(i for i in images if i.name == name)
    box = await make_sandbox(image=name, userns_range=2)
    await make_sandbox()  # busybox's copy for range 0 exists too
    await ctd.destroy_sandbox(box.id)
    copy = f"{image.chain_id}{ctd.uid_pool.mapping(2).snapshot_suffix}"
    assert copy in await ctd.snapshot_keys()
    await ctd.images.remove(name)  # a synchronous garbage collection
    keys = await ctd.snapshot_keys()
    assert copy not in keys and image.chain_id not in keys
    assert f"{busybox.chain_id}{ctd.uid_pool.mapping(0).snapshot_suffix}" in keys
