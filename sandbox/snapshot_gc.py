"""Collecting snapshot images a node no longer needs (fork and user snapshots).

Snapshot images (`corral.local/corral/snapshots/<episode>:<name>`,
`sandbox/snapshot.py`) are tagged on the node that made them and on each node
that copied one; nothing else ever removes a fork's or a user's. A node's
collector deletes one when all of these hold:

* it is older than the retention: neither made, moved (a snapshot again under
  the same ref), nor provisioned from (`corral.last_used`, which a provision
  sets at most once a minute) for `retention_s`;
* no container on this node has it as its image (live, warm, or stopped and
  not yet torn down);
* it is not the base (`corral.snapshot.base_image`) of an image that stays,
  however deep the lineage: a snapshot's parents stay as long as it does;
* it is not a hibernation snapshot (`:hibernate-<n>`): a hibernated episode has
  no container but wakes from it, and its teardown removes it.

Only images under the local registry's `corral/snapshots/` repository are ever
candidates. Only the image record is deleted, through the Images API; containerd's
garbage collector then frees the blobs and the snapshot chain nothing else
references (a child snapshot's manifest still references its parents' layers).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import grpc

from contract.errors import ImageNotFound
from contract.ids import HIBERNATION_TAG, LOCAL_REGISTRY, SNAPSHOT_REPO, resolve_image_name
from contract.labels import BASE_IMAGE_LABEL, LAST_USED_LABEL
from sandbox._gen.containerd.api.services.images.v1 import images_pb2
from sandbox.connection import Connection
from sandbox.grpc_errors import is_not_found, map_grpc_error

SNAPSHOT_PREFIX = f"{LOCAL_REGISTRY}/{SNAPSHOT_REPO}/"
_EPOCH = datetime.fromtimestamp(0, UTC)


@dataclass(frozen=True)
class ImageRecord:
    """What the decision needs of one image: its name, when it was last made, moved or
    used, and the image it was snapshotted from (empty if none)."""

    name: str
    touched: datetime
    base_image: str = ""


def is_candidate(name: str) -> bool:
    """A snapshot in the local registry's repository that is not a hibernation's."""
    if not name.startswith(SNAPSHOT_PREFIX):
        return False
    tag = name.rsplit("/", 1)[-1].partition(":")[2]
    return not tag.startswith(HIBERNATION_TAG)


def collectable(
    images: Iterable[ImageRecord], in_use: Collection[str], now: datetime, retention_s: float
) -> list[str]:
    """Names of the images to delete (sorted); ``in_use`` holds the containers' image names.

    ``retention_s`` <= 0 collects nothing. Every image (candidate or not) that stays
    keeps its base, and that base keeps its own, so nothing a kept image was made
    from goes.
    """
    if retention_s <= 0:
        return []
    records = {record.name: record for record in images}
    used = {resolve_image_name(name) for name in in_use}

    def expired(record: ImageRecord) -> bool:
        return (now - record.touched).total_seconds() > retention_s

    kept = {
        name
        for name, record in records.items()
        if not is_candidate(name) or name in used or not expired(record)
    }
    pending = list(kept)
    while pending:  # keep the lineage of every kept image
        base = records[pending.pop()].base_image
        if base and base in records and base not in kept:
            kept.add(base)
            pending.append(base)
    return sorted(set(records) - kept)


def image_record(image: Any) -> ImageRecord:
    """An `images_pb2.Image` as a record: touched is the latest of created, updated
    and the `corral.last_used` label."""
    times = [_EPOCH]
    for field in ("created_at", "updated_at"):
        if image.HasField(field):
            times.append(getattr(image, field).ToDatetime(tzinfo=UTC))
    last_used = image.labels.get(LAST_USED_LABEL, "")
    if last_used.isdigit():
        times.append(datetime.fromtimestamp(int(last_used), UTC))
    base = image.labels.get(BASE_IMAGE_LABEL, "")
    return ImageRecord(name=image.name, touched=max(times), base_image=base)


async def collect_snapshots(
    conn: Connection, retention_s: float, now: datetime | None = None
) -> list[str]:
    """Delete this node's snapshot images that nothing needs (module docstring);
    returns the names removed. The images are listed before the containers, and each
    is read again just before its deletion: one used or moved meanwhile stays."""
    if retention_s <= 0:
        return []
    try:
        listed = await conn.images.List(images_pb2.ListImagesRequest(), metadata=conn.md())
        records = [image_record(image) for image in listed.images]
        containers = await conn.list_containers()
    except grpc.aio.AioRpcError as err:
        raise map_grpc_error(err, "snapshot collection") from err
    moment = now or datetime.now(UTC)
    names = collectable(records, {c.image for c in containers}, moment, retention_s)
    by_name = {record.name: record for record in records}
    removed: list[str] = []
    for i, name in enumerate(names):
        # The last deletion waits for containerd's garbage collection: blobs freed now.
        if await _delete_unchanged(conn, by_name[name], sync=i == len(names) - 1):
            removed.append(name)
    return removed


async def _delete_unchanged(conn: Connection, record: ImageRecord, *, sync: bool) -> bool:
    """Delete ``record``'s image unless it was touched since it was listed or is gone."""
    try:
        current = await conn.images.Get(
            images_pb2.GetImageRequest(name=record.name), metadata=conn.md()
        )
        if image_record(current.image).touched != record.touched:
            return False
        await conn.images.Delete(
            images_pb2.DeleteImageRequest(name=record.name, sync=sync), metadata=conn.md()
        )
    except grpc.aio.AioRpcError as err:
        if is_not_found(err):
            return False  # removed meanwhile (a teardown, `corral image rm`)
        raise map_grpc_error(
            err, f"collect snapshot image {record.name!r}", not_found=ImageNotFound
        ) from err
    return True
