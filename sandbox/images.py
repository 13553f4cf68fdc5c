"""Images: import OCI archives through the Content and Images APIs, and unpack
their layers into a snapshot chain with the Diff service (no ctr).

Garbage-collection references follow containerd's conventions so that a
lease is only needed while importing: the manifest points at its config and
layers (``containerd.io/gc.ref.content.*``) and the config at the top
snapshot of the unpacked chain (``containerd.io/gc.ref.snapshot.<snapshotter>``).
"""

from __future__ import annotations

import asyncio
import builtins
import hashlib
import json
import platform
import tarfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import field_mask_pb2

from contract.errors import ImageImportFailed, ImageNotFound, SnapshotFailed
from contract.ids import LOCAL_REGISTRY, resolve_image_name
from contract.labels import CHAIN_ID_LABEL, LAST_USED_LABEL, STAGED_LABEL
from sandbox._gen.containerd.api.services.content.v1 import content_pb2
from sandbox._gen.containerd.api.services.diff.v1 import diff_pb2
from sandbox._gen.containerd.api.services.images.v1 import images_pb2
from sandbox._gen.containerd.api.services.leases.v1 import leases_pb2
from sandbox._gen.containerd.api.services.snapshots.v1 import snapshots_pb2
from sandbox._gen.containerd.api.types import descriptor_pb2
from sandbox.connection import Connection
from sandbox.grpc_errors import is_not_found, map_grpc_error
from sandbox.models import ImageInfo
from sandbox.oci_archive import GOARCH, MEDIA_INDEX, NAME_ANNOTATION

STAGED_WAIT_S = 120.0  # a staged snapshot's layer: a diff of its writes, a few GB at most
STAGED_POLL_S = 0.1
TOUCH_EVERY_S = 60  # provisions within a minute of each other update the label once
WRITE_CHUNK = 1024 * 1024
JSON_BLOB_MAX = 4 * 1024 * 1024  # manifests and configs are small; layers are not parsed
INDEX_TYPES = {MEDIA_INDEX, "application/vnd.docker.distribution.manifest.list.v2+json"}


def chain_ids(diff_ids: Sequence[str]) -> list[str]:
    """OCI chain ids: chain(0) = diff(0); chain(n) = sha256(chain(n-1) + " " + diff(n))."""
    chains: list[str] = []
    for diff_id in diff_ids:
        if not chains:
            chains.append(diff_id)
        else:
            text = f"{chains[-1]} {diff_id}".encode()
            chains.append("sha256:" + hashlib.sha256(text).hexdigest())
    return chains


def _gc_labels(blob: dict[str, Any]) -> dict[str, str]:
    """GC references from a manifest or index to its children."""
    labels: dict[str, str] = {}
    if "config" in blob:
        labels["containerd.io/gc.ref.content.config"] = blob["config"]["digest"]
    for i, layer in enumerate(blob.get("layers", [])):
        labels[f"containerd.io/gc.ref.content.l.{i}"] = layer["digest"]
    for i, manifest in enumerate(blob.get("manifests", [])):
        labels[f"containerd.io/gc.ref.content.m.{i}"] = manifest["digest"]
    return labels


def _labels_for_blob(archive: _Archive, digest: str) -> dict[str, str]:
    """Manifests and indexes reference children; layers (binary) reference nothing."""
    try:
        blob = archive.blob_json(digest)
    except (ValueError, UnicodeDecodeError):
        return {}
    # image configs are JSON too (with a "config" key of another meaning)
    is_manifest_or_index = isinstance(blob, dict) and "schemaVersion" in blob
    return _gc_labels(blob) if is_manifest_or_index else {}


def _descriptor(desc: dict[str, Any]) -> descriptor_pb2.Descriptor:
    return descriptor_pb2.Descriptor(
        media_type=desc["mediaType"], digest=desc["digest"], size=int(desc["size"])
    )


class _Archive:
    """Random access to the blobs of an OCI archive tar."""

    def __init__(self, path: Path) -> None:
        try:
            self.tar = tarfile.open(path, "r:*")  # noqa: SIM115 (closed by close())
            self.members = {m.name.lstrip("./"): m for m in self.tar.getmembers() if m.isfile()}
            self.index = json.loads(self.read("index.json"))
        except (OSError, tarfile.TarError, KeyError, ValueError) as exc:
            raise ImageImportFailed(f"{path}: not an OCI archive ({exc})") from exc
        self.path = path

    def read(self, name: str) -> bytes:
        member = self.members[name]
        handle = self.tar.extractfile(member)
        assert handle is not None
        return handle.read()

    def blob_name(self, digest: str) -> str:
        algo, hexdigest = digest.split(":", 1)
        return f"blobs/{algo}/{hexdigest}"

    def blob_json(self, digest: str) -> dict[str, Any]:
        return json.loads(self.read(self.blob_name(digest)))

    def blob_digests(self) -> list[str]:
        return [
            name.split("/")[1] + ":" + name.split("/")[2]
            for name in self.members
            if name.startswith("blobs/") and name.count("/") == 2
        ]

    def chunks(self, digest: str) -> AsyncIterator[bytes]:
        handle = self.tar.extractfile(self.members[self.blob_name(digest)])
        assert handle is not None

        async def gen() -> AsyncIterator[bytes]:
            while chunk := handle.read(WRITE_CHUNK):
                yield chunk

        return gen()

    def close(self) -> None:
        self.tar.close()


class ImageStore:
    """``client.images``: import, list, get, remove, unpack."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    # -- queries -------------------------------------------------------------
    async def list(self) -> builtins.list[ImageInfo]:
        try:
            resp = await self._conn.images.List(images_pb2.ListImagesRequest(), metadata=self._md())
        except grpc.aio.AioRpcError as err:
            raise map_grpc_error(err, "list images") from err
        return [_image_info(image) for image in resp.images]

    async def get(self, name: str) -> ImageInfo:
        full = resolve_image_name(name)
        try:
            resp = await self._conn.images.Get(
                images_pb2.GetImageRequest(name=full), metadata=self._md()
            )
        except grpc.aio.AioRpcError as err:
            raise map_grpc_error(err, f"image {full!r}", not_found=ImageNotFound) from err
        info = _image_info(resp.image)
        if info.chain_id is None:
            info.chain_id = (await self._chain_ids_from_store(info))[-1]
        return info

    async def whole(self, name: str, timeout_s: float = STAGED_WAIT_S) -> ImageInfo:
        """Image ``name`` once it is whole: a staged snapshot (sandbox/snapshot.py)
        names its base's manifest until its own layer is written, which is what
        a copy, a push or a snapshot on top of it needs."""
        deadline = time.monotonic() + timeout_s
        while True:
            info = await self.get(name)
            if STAGED_LABEL not in info.labels:
                return info
            if time.monotonic() >= deadline:
                raise SnapshotFailed(
                    f"snapshot image {info.name!r}: its layer was not written within "
                    f"{timeout_s:.0f} s (is its node worker running?)"
                )
            await asyncio.sleep(STAGED_POLL_S)

    async def remove(self, name: str) -> None:
        full = resolve_image_name(name)
        try:
            await self._conn.images.Delete(
                images_pb2.DeleteImageRequest(name=full, sync=True), metadata=self._md()
            )
        except grpc.aio.AioRpcError as err:
            raise map_grpc_error(err, f"image {full!r}", not_found=ImageNotFound) from err

    # -- use and prune ---------------------------------------------------------
    async def touch(self, image: ImageInfo) -> None:
        """Record that ``image`` was used now (at most once a minute: one RPC)."""
        now = int(time.time())
        if now - int(image.labels.get(LAST_USED_LABEL, "0") or 0) < TOUCH_EVERY_S:
            return
        await self.set_label(image.name, LAST_USED_LABEL, str(now))

    async def set_label(self, name: str, key: str, value: str) -> None:
        try:
            await self._conn.images.Update(
                images_pb2.UpdateImageRequest(
                    image=images_pb2.Image(name=name, labels={key: value}),
                    update_mask=field_mask_pb2.FieldMask(paths=[f"labels.{key}"]),
                ),
                metadata=self._md(),
            )
        except grpc.aio.AioRpcError as err:
            raise map_grpc_error(err, f"image {name!r}", not_found=ImageNotFound) from err

    async def prune(self, keep_bytes: int) -> builtins.list[ImageInfo]:
        """Remove least-recently-used registry images until at most ``keep_bytes`` remain.

        Images a container (live sandbox) uses are never removed, nor local
        ones (``corral.local/...``), which no registry could give back.
        """
        in_use = await self._images_in_use()
        sized = [(image, await self.image_bytes(image)) for image in await self.list()]
        total = sum(size for _, size in sized)
        candidates = sorted(
            (
                pair
                for pair in sized
                if pair[0].name not in in_use and not pair[0].name.startswith(f"{LOCAL_REGISTRY}/")
            ),
            key=lambda pair: int(pair[0].labels.get(LAST_USED_LABEL, "0") or 0),
        )
        removed = []
        for image, size in candidates:
            if total <= keep_bytes:
                break
            await self.remove(image.name)
            removed.append(image)
            total -= size
        return removed

    async def _images_in_use(self) -> set[str]:
        try:
            containers = await self._conn.list_containers()
        except grpc.aio.AioRpcError as err:
            raise map_grpc_error(err, "list containers") from err
        return {container.image for container in containers}

    async def image_bytes(self, image: ImageInfo) -> int:
        """Compressed size of the platform manifest's config and layers (shared layers count
        once per image)."""
        try:
            manifest = await self._manifest_from_store(image)
        except (grpc.aio.AioRpcError, ImageNotFound, ValueError):
            return 0  # content already gone: nothing to win by removing it
        return int(manifest["config"]["size"]) + sum(
            int(layer["size"]) for layer in manifest["layers"]
        )

    async def content_digests(self) -> set[str]:
        """Every blob in the content store (of any image, or of none)."""
        digests: set[str] = set()
        call = self._conn.content.List(content_pb2.ListContentRequest(), metadata=self._md())
        async for resp in call:
            digests.update(info.digest for info in resp.info)
        return digests

    def read_chunks(self, digest: str) -> AsyncIterator[bytes]:
        """A blob of the content store, streamed."""
        call = self._conn.content.Read(
            content_pb2.ReadContentRequest(digest=digest), metadata=self._md()
        )

        async def gen() -> AsyncIterator[bytes]:
            async for resp in call:
                yield resp.data

        return gen()

    # -- import --------------------------------------------------------------
    async def import_archive(self, path: Path) -> builtins.list[ImageInfo]:
        """Import every named manifest of the OCI archive at ``path`` and unpack it."""
        archive = _Archive(Path(path))
        try:
            async with self._conn.lease("import") as lease:
                await self._write_blobs(archive, lease)
                imported = []
                for entry in archive.index.get("manifests", []):
                    name = entry.get("annotations", {}).get(NAME_ANNOTATION)
                    if not name:
                        continue
                    manifest = self._platform_manifest(archive, entry)
                    config = archive.blob_json(manifest["config"]["digest"])
                    chains = chain_ids(config["rootfs"]["diff_ids"])
                    await self.unpack(manifest, chains, lease)
                    imported.append(
                        await self._put_image(resolve_image_name(name), entry, chains[-1])
                    )
        except grpc.aio.AioRpcError as err:
            raise ImageImportFailed(str(map_grpc_error(err, f"import {path}"))) from err
        finally:
            archive.close()
        if not imported:
            raise ImageImportFailed(f"{path}: no manifest carries {NAME_ANNOTATION}")
        return imported

    def _platform_manifest(self, archive: _Archive, entry: dict[str, Any]) -> dict[str, Any]:
        blob = archive.blob_json(entry["digest"])
        if entry.get("mediaType") not in INDEX_TYPES and "manifests" not in blob:
            return blob
        arch = GOARCH.get(platform.machine(), platform.machine())
        for child in blob["manifests"]:
            plat = child.get("platform", {})
            if plat.get("os", "linux") == "linux" and plat.get("architecture", arch) == arch:
                return self._platform_manifest(archive, child)
        raise ImageImportFailed(f"{archive.path}: no manifest for linux/{arch}")

    async def _write_blobs(self, archive: _Archive, lease: str) -> None:
        for digest in archive.blob_digests():
            if await self._has_content(digest):
                continue
            member = archive.members[archive.blob_name(digest)]
            labels = _labels_for_blob(archive, digest) if member.size < JSON_BLOB_MAX else {}
            await self._write_content(digest, member.size, archive.chunks(digest), labels, lease)

    async def hold_content(self, digest: str, lease: str) -> bool:
        """Put a blob the store has under ``lease`` too (False if it is not there): a
        concurrent failed pull's garbage collection must not take it from this one."""
        try:
            await self._conn.leases.AddResource(
                leases_pb2.AddResourceRequest(
                    id=lease, resource=leases_pb2.Resource(id=digest, type="content")
                ),
                metadata=self._md(),
            )
        except grpc.aio.AioRpcError as err:
            if is_not_found(err):
                return False
            raise
        return await self._has_content(digest)

    async def _has_content(self, digest: str) -> bool:
        try:
            await self._conn.content.Info(
                content_pb2.InfoRequest(digest=digest), metadata=self._md()
            )
        except grpc.aio.AioRpcError as err:
            if is_not_found(err):
                return False
            raise
        return True

    async def _write_content(
        self,
        digest: str,
        size: int,
        chunks: AsyncIterator[bytes],
        labels: dict[str, str],
        lease: str,
    ) -> None:
        ref = f"corral-import-{digest}-{uuid.uuid4().hex[:8]}"

        async def requests() -> AsyncIterator[content_pb2.WriteContentRequest]:
            offset = 0
            async for chunk in chunks:
                yield content_pb2.WriteContentRequest(
                    action=content_pb2.WRITE,
                    ref=ref,
                    total=size,
                    expected=digest,
                    offset=offset,
                    data=chunk,
                )
                offset += len(chunk)
            yield content_pb2.WriteContentRequest(
                action=content_pb2.COMMIT,
                ref=ref,
                total=size,
                expected=digest,
                offset=offset,
                labels=labels,
            )

        call = self._conn.content.Write(requests(), metadata=self._md(lease))
        try:
            async for _ in call:
                pass
        except grpc.aio.AioRpcError as err:
            if err.code() != grpc.StatusCode.ALREADY_EXISTS:
                raise

    async def _put_image(self, name: str, entry: dict[str, Any], chain_id: str) -> ImageInfo:
        labels = {CHAIN_ID_LABEL: chain_id, LAST_USED_LABEL: str(int(time.time()))}
        image = images_pb2.Image(name=name, target=_descriptor(entry), labels=labels)
        try:
            resp = await self._conn.images.Create(
                images_pb2.CreateImageRequest(image=image), metadata=self._md()
            )
        except grpc.aio.AioRpcError as err:
            if err.code() != grpc.StatusCode.ALREADY_EXISTS:
                raise
            resp = await self._conn.images.Update(
                images_pb2.UpdateImageRequest(image=image), metadata=self._md()
            )
        return _image_info(resp.image)

    # -- unpack --------------------------------------------------------------
    async def unpack(self, manifest: dict[str, Any], chains: Sequence[str], lease: str) -> None:
        """Apply each layer on its parent snapshot, committing it under its chain id."""
        parent = ""
        for layer, chain in zip(manifest["layers"], chains, strict=True):
            if not await self._has_snapshot(chain):
                await self._apply_layer(layer, chain, parent, lease)
            parent = chain
        await self.keep_snapshot(manifest["config"]["digest"], chains[-1], lease=lease)

    async def keep_snapshot(
        self, config_digest: str, key: str, slot: str = "", lease: str | None = None
    ) -> None:
        """Keep snapshot ``key`` exactly as long as the image whose config blob this
        is: a garbage-collection reference from the blob (containerd reads
        ``gc.ref.snapshot.<snapshotter>[/<slot>]``; one label per slot)."""
        label = f"containerd.io/gc.ref.snapshot.{self._conn.snapshotter}"
        if slot:
            label += f"/{slot}"
        await self._conn.content.Update(
            content_pb2.UpdateRequest(
                info=content_pb2.Info(digest=config_digest, labels={label: key}),
                update_mask=field_mask_pb2.FieldMask(paths=[f"labels.{label}"]),
            ),
            metadata=self._md(lease),
        )

    async def _apply_layer(
        self, layer: dict[str, Any], chain: str, parent: str, lease: str
    ) -> None:
        snaps, snapshotter = self._conn.snapshots, self._conn.snapshotter
        key = f"extract-{uuid.uuid4().hex[:12]} {chain}"
        md = self._md(lease)
        prepared = await snaps.Prepare(
            snapshots_pb2.PrepareSnapshotRequest(snapshotter=snapshotter, key=key, parent=parent),
            metadata=md,
        )
        try:
            applied = await self._conn.diff.Apply(
                diff_pb2.ApplyRequest(diff=_descriptor(layer), mounts=prepared.mounts), metadata=md
            )
            _check_chain(layer, parent, applied.applied.digest, chain)
            await snaps.Commit(
                snapshots_pb2.CommitSnapshotRequest(snapshotter=snapshotter, name=chain, key=key),
                metadata=md,
            )
        except grpc.aio.AioRpcError as err:
            await self._remove_snapshot(key)
            if err.code() != grpc.StatusCode.ALREADY_EXISTS:  # a concurrent unpack won
                raise
        except ImageImportFailed:
            await self._remove_snapshot(key)
            raise

    async def _has_snapshot(self, key: str) -> bool:
        try:
            await self._conn.snapshots.Stat(
                snapshots_pb2.StatSnapshotRequest(snapshotter=self._conn.snapshotter, key=key),
                metadata=self._md(),
            )
        except grpc.aio.AioRpcError as err:
            if is_not_found(err):
                return False
            raise
        return True

    async def _remove_snapshot(self, key: str) -> None:
        try:
            await self._conn.snapshots.Remove(
                snapshots_pb2.RemoveSnapshotRequest(snapshotter=self._conn.snapshotter, key=key),
                metadata=self._md(),
            )
        except grpc.aio.AioRpcError as err:
            if not is_not_found(err):
                raise

    async def ensure_unpacked(self, image: ImageInfo) -> str:
        """Unpack ``image`` if its top snapshot is missing (e.g. imported by another tool)."""
        chains = await self._chain_ids_from_store(image)
        if not await self._has_snapshot(chains[-1]):
            manifest = await self._manifest_from_store(image)
            async with self._conn.lease("unpack") as lease:
                await self.unpack(manifest, chains, lease)
        return chains[-1]

    async def _read_json(self, digest: str) -> dict[str, Any]:
        return json.loads(await self.read_bytes(digest))

    async def read_bytes(self, digest: str) -> bytes:
        data = bytearray()
        async for chunk in self.read_chunks(digest):
            data += chunk
        return bytes(data)

    async def _manifest_from_store(self, image: ImageInfo) -> dict[str, Any]:
        blob = await self._read_json(image.digest)
        arch = GOARCH.get(platform.machine(), platform.machine())
        while "manifests" in blob:
            children = [
                m
                for m in blob["manifests"]
                if m.get("platform", {}).get("architecture", arch) == arch
            ]
            if not children:
                raise ImageNotFound(f"image {image.name!r}: no manifest for linux/{arch}")
            blob = await self._read_json(children[0]["digest"])
        return blob

    async def _chain_ids_from_store(self, image: ImageInfo) -> builtins.list[str]:
        manifest = await self._manifest_from_store(image)
        config = await self._read_json(manifest["config"]["digest"])
        return chain_ids(config["rootfs"]["diff_ids"])

    def _md(self, lease: str | None = None) -> tuple[tuple[str, str], ...]:
        return self._conn.md(lease)


def _check_chain(layer: dict[str, Any], parent: str, diff_id: str, chain: str) -> None:
    """The unpacked layer must be the one the config's diff_ids promise."""
    expected = chain_ids([parent, diff_id])[-1] if parent else diff_id
    if expected != chain:
        raise ImageImportFailed(
            f"layer {layer['digest']}: unpacked content {diff_id} does not match the "
            "image config's diff_ids"
        )


def _image_info(image: Any) -> ImageInfo:
    labels = dict(image.labels)
    return ImageInfo(
        name=image.name,
        digest=image.target.digest,
        media_type=image.target.media_type,
        size=image.target.size,
        chain_id=labels.get(CHAIN_ID_LABEL),
        labels=labels,
    )
