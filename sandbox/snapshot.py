"""Snapshots: a sandbox's writable layer committed as a new image on top of its image.

The Diff service compares the image's top snapshot (a read-only view) with the
sandbox's active snapshot and writes the changes as an uncompressed OCI layer
tar into the content store, whiteouts included (containerd's walking differ
mounts the live overlay read-only, so the sandbox keeps running; it is paused
for the diff so that the layer is one consistent moment). The layer is then
stacked on the image's manifest and config, written as new blobs with the
garbage-collection references `sandbox.images` uses, and tagged.

In the same pause, unless a snapshot of that chain exists already (nothing
changed since the last one), the sandbox's upper dir is copied (a reflink on
the btrfs quota filesystem) into a snapshot prepared on the sandbox's own
parent and committed under the new chain id: what unpacking the tar would
make, without extracting it. For a user-namespaced sandbox that parent is its
range's chowned copy of the image, so children of the same range start at
once; a sandbox outside the range unpacks the tar on first use
(`ensure_unpacked`).

A fork does not wait for the diff (`stage_sandbox`): in the pause it only
commits the copy, under a name of its own, and tags the snapshot's ref at
once with the base's manifest and that copy as its chain (`STAGED_LABEL`), so
children on this node start from the copy within a tenth of a second. The
layer blob, the real manifest and the chain-id snapshot (an empty layer over
the copy) follow off the children's path (`materialize`); whatever needs the
layer itself (a copy to another node, a push, a snapshot of a child) waits
for it (`ImageStore.whole`).

`copy_image` moves an image between two containerd daemons of one machine
(the local multi-node rig without a registry): blobs are streamed from one
content store into the other, then unpacked.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import grpc

from contract.errors import SandboxError, SandboxNotFound, SnapshotFailed
from contract.ids import resolve_image_name
from contract.labels import (
    BASE_IMAGE_LABEL,
    CHAIN_ID_LABEL,
    LAYER_BYTES_LABEL,
    SNAPSHOT_SANDBOX_LABEL,
    STAGED_LABEL,
    STAGED_LEASE_LABEL,
)
from sandbox import hosttools
from sandbox._gen.containerd.api.services.containers.v1 import containers_pb2
from sandbox._gen.containerd.api.services.content.v1 import content_pb2
from sandbox._gen.containerd.api.services.diff.v1 import diff_pb2
from sandbox._gen.containerd.api.services.images.v1 import images_pb2
from sandbox._gen.containerd.api.services.snapshots.v1 import snapshots_pb2
from sandbox.connection import Connection
from sandbox.grpc_errors import is_not_found, map_grpc_error
from sandbox.images import ImageStore, _gc_labels, chain_ids
from sandbox.models import ImageInfo
from sandbox.oci_archive import MEDIA_MANIFEST

MEDIA_LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
# A plain (non-reflink) copy of a few GB of writes on a slow disk stays well inside this.
COPY_TIMEOUT_S = 600.0


async def commit_sandbox(
    conn: Connection,
    images: ImageStore,
    sandbox_id: str,
    ref: str,
    labels: dict[str, str],
    *,
    pause: bool = True,
) -> ImageInfo:
    """Commit ``sandbox_id``'s writable layer as image ``ref`` (labels added to the
    image); ``pause=False`` when the caller holds it paused (`paused_all`)."""
    base = await _base_image(conn, images, sandbox_id)
    manifest = await images._manifest_from_store(base)
    config = await images._read_json(manifest["config"]["digest"])
    async with conn.lease("snapshot") as lease:
        parent, upper = await _writable_layer(conn, sandbox_id, base, lease)
        suffix = _userns_suffix(parent)
        async with _paused(conn, sandbox_id, pause):
            layer = await _diff(conn, sandbox_id, parent, upper, lease)
            # An uncompressed layer's digest is its diff id.
            diff_ids = [*config["rootfs"]["diff_ids"], layer["digest"]]
            chains = chain_ids(diff_ids)
            top = chains[-1] + suffix
            if not await images._has_snapshot(top):  # else: unchanged since the last one
                await _copy_upper(conn, sandbox_id, upper, parent, top, lease)
        new_manifest = await _stack_layer(images, manifest, config, layer, diff_ids, lease)
        # Under the slot unpacking or the user-namespace copy would have used.
        slot = suffix.removeprefix("@")
        await images.keep_snapshot(new_manifest["config"]["digest"], top, slot, lease)
        manifest_desc = await _write_json(images, new_manifest, _gc_labels(new_manifest), lease)
        all_labels = {
            **labels,
            BASE_IMAGE_LABEL: base.name,
            SNAPSHOT_SANDBOX_LABEL: sandbox_id,
            LAYER_BYTES_LABEL: str(layer["size"]),
        }
        return await put_image(conn, resolve_image_name(ref), manifest_desc, chains[-1], all_labels)


async def stage_sandbox(
    conn: Connection,
    images: ImageStore,
    sandbox_id: str,
    ref: str,
    labels: dict[str, str],
    *,
    pause: bool = True,
) -> ImageInfo:
    """Image ``ref`` usable on this node at once: a committed copy of the sandbox's
    writable layer under a name of its own, tagged with its base's manifest and
    that copy as its chain. `materialize` writes the layer and the real manifest."""
    base = await _base_image(conn, images, sandbox_id)
    # Holds the copy until the chain-id snapshot of the whole image sits on it;
    # it expires by itself (LEASE_TTL) when the worker dies first.
    lease = await conn.create_lease("staged")
    try:
        parent, upper = await _writable_layer(conn, sandbox_id, base, lease)
        stem = f"corral-staged-{uuid.uuid4().hex[:16]}"
        staged = stem + _userns_suffix(parent)
        async with _paused(conn, sandbox_id, pause):
            await _copy_upper(conn, sandbox_id, upper, parent, staged, lease)
        target = {"mediaType": base.media_type, "digest": base.digest, "size": base.size}
        all_labels = {
            **labels,
            BASE_IMAGE_LABEL: base.name,
            SNAPSHOT_SANDBOX_LABEL: sandbox_id,
            STAGED_LABEL: staged,
            STAGED_LEASE_LABEL: lease,
        }
        # The chain a sandbox prepares on is the label plus its user-namespace
        # suffix (sandbox.userns): `staged` itself for one of this sandbox's range.
        return await put_image(conn, resolve_image_name(ref), target, stem, all_labels)
    except BaseException:
        await conn.delete_lease(lease)
        raise


async def materialize(conn: Connection, images: ImageStore, name: str) -> ImageInfo:
    """Make staged image ``name`` whole: its layer (the staged copy's diff over
    its parent), config and manifest, and its chain-id snapshot over the copy;
    then the staged labels go. A whole image is returned as it is."""
    info = await images.get(name)
    staged = info.labels.get(STAGED_LABEL)
    if not staged:
        return info
    manifest = await images._manifest_from_store(info)
    config = await images._read_json(manifest["config"]["digest"])
    what = f"snapshot image {info.name!r}"
    async with conn.lease("materialize") as lease:
        parent = await _snapshot_parent(conn, staged)
        if not parent and not await images._has_snapshot(staged):
            raise SnapshotFailed(f"{what}: its staged copy {staged!r} is gone")
        view_key = f"snapshot-staged-{uuid.uuid4().hex[:12]}"
        try:
            view = await conn.snapshots.View(
                snapshots_pb2.ViewSnapshotRequest(
                    snapshotter=conn.snapshotter, key=view_key, parent=staged
                ),
                metadata=conn.md(lease),
            )
            layer = await _diff(conn, staged, parent, view.mounts, lease)
        finally:
            await _remove_snapshot_quietly(conn, view_key)
        diff_ids = [*config["rootfs"]["diff_ids"], layer["digest"]]
        chains = chain_ids(diff_ids)
        suffix = _userns_suffix(staged)
        top = chains[-1] + suffix
        if not await images._has_snapshot(top):
            await _stack_empty(conn, staged, top, lease, what)
        new_manifest = await _stack_layer(images, manifest, config, layer, diff_ids, lease)
        await images.keep_snapshot(
            new_manifest["config"]["digest"], top, suffix.removeprefix("@"), lease
        )
        manifest_desc = await _write_json(images, new_manifest, _gc_labels(new_manifest), lease)
        labels = {
            **{k: v for k, v in info.labels.items() if k not in (STAGED_LABEL, STAGED_LEASE_LABEL)},
            LAYER_BYTES_LABEL: str(layer["size"]),
        }
        whole = await put_image(conn, info.name, manifest_desc, chains[-1], labels)
    await conn.delete_lease(info.labels.get(STAGED_LEASE_LABEL, ""))
    return whole


async def _stack_empty(conn: Connection, parent: str, name: str, lease: str, what: str) -> None:
    """Commit an empty layer over ``parent`` as ``name``: the chain id the image's
    layers name, holding the staged copy (its parent) as long as the image lives."""
    await _commit_on(conn, parent, name, lease, what, "snapshot-chain")


async def _commit_on(
    conn: Connection,
    parent: str,
    name: str,
    lease: str,
    what: str,
    prefix: str,
    fill: Callable[[Any], Awaitable[None]] | None = None,
) -> None:
    """Prepare a snapshot on ``parent``, let ``fill`` write into it (given its
    mounts), commit it as ``name``; one committed under that name meanwhile is
    the same content (ALREADY_EXISTS is fine). The prepared key never stays."""
    key = f"{prefix}-{uuid.uuid4().hex[:12]}"
    md = conn.md(lease)
    try:
        prepared = await conn.snapshots.Prepare(
            snapshots_pb2.PrepareSnapshotRequest(
                snapshotter=conn.snapshotter, key=key, parent=parent
            ),
            metadata=md,
        )
    except grpc.aio.AioRpcError as err:
        raise map_grpc_error(err, f"{what}: prepare on {parent!r}") from err
    try:
        if fill is not None:
            await fill(prepared.mounts)
        await conn.snapshots.Commit(
            snapshots_pb2.CommitSnapshotRequest(snapshotter=conn.snapshotter, name=name, key=key),
            metadata=md,
        )
    except grpc.aio.AioRpcError as err:
        await _remove_snapshot_quietly(conn, key)
        if err.code() != grpc.StatusCode.ALREADY_EXISTS:
            raise map_grpc_error(err, f"{what}: commit {name!r}") from err
    except BaseException:
        await _remove_snapshot_quietly(conn, key)
        raise


async def _base_image(conn: Connection, images: ImageStore, sandbox_id: str) -> ImageInfo:
    """The image the sandbox was made from, whole (a staged one's layer written)."""
    container = await _container(conn, sandbox_id)
    return await images.whole(container.image)


async def _writable_layer(
    conn: Connection, sandbox_id: str, base: ImageInfo, lease: str
) -> tuple[str, Any]:
    """The snapshot the sandbox's writable layer really sits on, and that layer's mounts."""
    parent = await _snapshot_parent(conn, sandbox_id) or base.chain_id or ""
    with _mapped_errors(sandbox_id):
        upper = await conn.snapshots.Mounts(
            snapshots_pb2.MountsRequest(snapshotter=conn.snapshotter, key=sandbox_id),
            metadata=conn.md(lease),
        )
    return parent, upper.mounts


@contextlib.contextmanager
def _mapped_errors(sandbox_id: str) -> Iterator[None]:
    """containerd's errors as the sandbox layer's typed ones, naming the snapshot."""
    try:
        yield
    except grpc.aio.AioRpcError as err:
        raise map_grpc_error(
            err, f"snapshot of sandbox {sandbox_id!r}", not_found=SandboxNotFound
        ) from err


def _userns_suffix(parent: str) -> str:
    """``@userns-<host id>-<size>`` when the sandbox sat on a remapped copy (sandbox.userns)."""
    _, at, suffix = parent.rpartition("@userns-")
    return f"{at}{suffix}" if at else ""


async def _copy_upper(
    conn: Connection, sandbox_id: str, upper: Any, parent: str, name: str, lease: str
) -> None:
    """Commit a copy of the sandbox's upper dir on ``parent`` as snapshot ``name``.

    The copy is what unpacking the layer would make (an overlay upper dir is
    the snapshotter's own layer format: whiteouts as 0/0 devices, opaque
    directories by xattr), without extracting the tar again; on the btrfs
    quota filesystem it is a reflink copy (tens of ms for 100 MB). It sits on
    the sandbox's own parent, so a user-namespaced sandbox's snapshot is
    already in its range: its children need no chowned copy of their own.
    The caller holds the sandbox paused, so it is the moment of the diff.
    """
    what = f"snapshot of sandbox {sandbox_id!r}"

    async def copy(mounts: Any) -> None:
        await hosttools.run_tool(
            f"{what}: copy of its writable layer",
            *("cp", "-a", "--reflink=auto"),
            f"{_upper_dir(upper, what)}/.",
            _upper_dir(mounts, what),
            error=SnapshotFailed,
            timeout_s=COPY_TIMEOUT_S,
        )

    await _commit_on(conn, parent, name, lease, what, "snapshot-copy", copy)


def _upper_dir(mounts: Any, what: str) -> str:
    for mount in mounts:
        for option in mount.options:
            if option.startswith("upperdir="):
                return str(option.removeprefix("upperdir="))
        if mount.type == "bind" and "rw" in mount.options:
            return str(mount.source)  # a snapshot with no parent is a plain directory
    raise SnapshotFailed(f"{what}: the snapshotter gave no writable directory")


async def _snapshot_parent(conn: Connection, sandbox_id: str) -> str:
    """The parent the sandbox's writable layer really sits on: for a user-namespaced
    sandbox the image's chain chowned into its uid range (sandbox.userns), so the
    diff holds only what the sandbox changed, not every re-owned file."""
    try:
        resp = await conn.snapshots.Stat(
            snapshots_pb2.StatSnapshotRequest(snapshotter=conn.snapshotter, key=sandbox_id),
            metadata=conn.md(),
        )
    except grpc.aio.AioRpcError:
        return ""
    return str(resp.info.parent)


async def _container(conn: Connection, sandbox_id: str) -> Any:
    with _mapped_errors(sandbox_id):
        resp = await conn.containers.Get(
            containers_pb2.GetContainerRequest(id=sandbox_id), metadata=conn.md()
        )
    return resp.container


async def _diff(
    conn: Connection, sandbox_id: str, parent_chain: str, upper: Any, lease: str
) -> dict[str, Any]:
    """The changes of ``upper`` (the sandbox's live mounts, the caller holding it
    paused; or a view of its staged copy) over ``parent_chain`` as a layer blob
    (descriptor dict)."""
    view_key = f"snapshot-view-{uuid.uuid4().hex[:12]}"
    md = conn.md(lease)
    snaps, snapshotter = conn.snapshots, conn.snapshotter
    try:
        with _mapped_errors(sandbox_id):
            view = await snaps.View(
                snapshots_pb2.ViewSnapshotRequest(
                    snapshotter=snapshotter, key=view_key, parent=parent_chain
                ),
                metadata=md,
            )
            resp = await conn.diff.Diff(
                diff_pb2.DiffRequest(
                    left=view.mounts,
                    right=upper,
                    media_type=MEDIA_LAYER_TAR,
                    ref=f"corral-{view_key}",
                ),
                metadata=md,
            )
    finally:
        await _remove_snapshot_quietly(conn, view_key)
    return {"mediaType": resp.diff.media_type, "digest": resp.diff.digest, "size": resp.diff.size}


@contextlib.asynccontextmanager
async def paused_all(conn: Connection, sandbox_ids: list[str]) -> AsyncIterator[None]:
    """Freeze all of them for the block: an episode's sandbox and its services
    snapshotted at one moment."""
    async with contextlib.AsyncExitStack() as stack:
        for sandbox_id in sandbox_ids:
            await stack.enter_async_context(_paused(conn, sandbox_id))
        yield


class _paused:
    """Freeze the sandbox for the block if it runs (a quarantined one is paused
    already); nothing when ``pause`` is False (the caller holds it paused)."""

    def __init__(self, conn: Connection, sandbox_id: str, pause: bool = True) -> None:
        self._conn, self._id, self._paused, self._pause = conn, sandbox_id, False, pause

    async def __aenter__(self) -> None:
        from sandbox._gen.containerd.api.services.tasks.v1 import tasks_pb2
        from sandbox._gen.containerd.api.types.task import task_pb2

        if not self._pause:
            return
        tasks, md = self._conn.tasks, self._conn.md()
        try:
            task = await tasks.Get(tasks_pb2.GetRequest(container_id=self._id), metadata=md)
        except grpc.aio.AioRpcError as err:
            if is_not_found(err):
                return  # no task (stopped): nothing writes
            raise
        if task.process.status == task_pb2.RUNNING:
            await tasks.Pause(tasks_pb2.PauseTaskRequest(container_id=self._id), metadata=md)
            self._paused = True

    async def __aexit__(self, *exc: object) -> None:
        from sandbox._gen.containerd.api.services.tasks.v1 import tasks_pb2

        if self._paused:
            await self._conn.tasks.Resume(
                tasks_pb2.ResumeTaskRequest(container_id=self._id), metadata=self._conn.md()
            )


async def _stack_layer(
    images: ImageStore,
    manifest: dict[str, Any],
    config: dict[str, Any],
    layer: dict[str, Any],
    diff_ids: list[str],
    lease: str,
) -> dict[str, Any]:
    """The base manifest and config with ``layer`` (whose diff ids end ``diff_ids``)
    on top; the config blob is written."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    new_config = dict(config)
    new_config["rootfs"] = {"type": "layers", "diff_ids": diff_ids}
    new_config["created"] = now
    new_config["history"] = [
        *config.get("history", []),
        {"created": now, "created_by": "corral snapshot"},
    ]
    config_desc = await _write_json(
        images, new_config, {}, lease, media_type=manifest["config"]["mediaType"]
    )
    new_manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": config_desc,
        "layers": [*manifest["layers"], layer],
    }
    return new_manifest


async def _write_json(
    images: ImageStore,
    blob: dict[str, Any],
    labels: dict[str, str],
    lease: str,
    media_type: str = MEDIA_MANIFEST,
) -> dict[str, Any]:
    data = json.dumps(blob, separators=(",", ":")).encode()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()

    async def one_chunk() -> AsyncIterator[bytes]:
        yield data

    await images._write_content(digest, len(data), one_chunk(), labels, lease)
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


async def put_image(
    conn: Connection, name: str, target: dict[str, Any], chain_id: str, labels: dict[str, str]
) -> ImageInfo:
    """Create or move image ``name`` to ``target`` (a manifest descriptor dict)."""
    from sandbox.images import _descriptor, _image_info

    image = images_pb2.Image(
        name=name, target=_descriptor(target), labels={**labels, CHAIN_ID_LABEL: chain_id}
    )
    try:
        resp = await conn.images.Create(
            images_pb2.CreateImageRequest(image=image), metadata=conn.md()
        )
    except grpc.aio.AioRpcError as err:
        if err.code() != grpc.StatusCode.ALREADY_EXISTS:
            raise map_grpc_error(err, f"image {name!r}") from err
        resp = await conn.images.Update(
            images_pb2.UpdateImageRequest(image=image), metadata=conn.md()
        )
    return _image_info(resp.image)


async def _remove_snapshot_quietly(conn: Connection, key: str) -> None:
    try:
        await conn.snapshots.Remove(
            snapshots_pb2.RemoveSnapshotRequest(snapshotter=conn.snapshotter, key=key),
            metadata=conn.md(),
        )
    except grpc.aio.AioRpcError as err:
        if not is_not_found(err):
            raise map_grpc_error(err, f"remove snapshot {key!r}") from err


# -- between daemons ---------------------------------------------------------------
async def copy_image(
    src_conn: Connection, src: ImageStore, dst_conn: Connection, dst: ImageStore, name: str
) -> ImageInfo:
    """Copy image ``name`` (manifest, config, layers, labels) from ``src`` into ``dst``
    (a staged snapshot once its layer is written)."""
    info = await src.whole(name)
    manifest = await src._manifest_from_store(info)
    config = await src._read_json(manifest["config"]["digest"])
    async with dst_conn.lease("copy") as lease:
        for desc in [manifest["config"], *manifest["layers"]]:
            await _copy_blob(src_conn, dst, desc, {}, lease)
        manifest_desc = await _write_json(
            dst,
            manifest,
            _gc_labels(manifest),
            lease,
            media_type=manifest.get("mediaType", MEDIA_MANIFEST),
        )
        chains = chain_ids(config["rootfs"]["diff_ids"])
        await dst.unpack(manifest, chains, lease)
        return await put_image(dst_conn, info.name, manifest_desc, chains[-1], info.labels)


async def _copy_blob(
    src_conn: Connection, dst: ImageStore, desc: dict[str, Any], labels: dict[str, str], lease: str
) -> None:
    if await dst._has_content(desc["digest"]):
        return

    async def chunks() -> AsyncIterator[bytes]:
        call = src_conn.content.Read(
            content_pb2.ReadContentRequest(digest=desc["digest"]), metadata=src_conn.md()
        )
        async for resp in call:
            yield resp.data

    try:
        await dst._write_content(desc["digest"], int(desc["size"]), chunks(), labels, lease)
    except grpc.aio.AioRpcError as err:
        raise SandboxError(f"copy blob {desc['digest']}: {err.details()}") from err
