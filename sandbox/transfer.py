"""Pull images from registries into containerd, and push them back out.

A pull holds one lease for all it writes (index, manifest, config, layers, the
unpacked snapshot chain) and creates the image record last, so that a pull
that fails anywhere leaves no image behind: the lease is then deleted with a
synchronous garbage collection, which takes every blob and snapshot only this
pull made. Blobs the store already holds (shared layers) are not fetched again.

``Puller`` is what a node uses: ``ensure`` returns the image if the node has
it (and records the use for ``corral image prune``), else pulls it; any number
of concurrent ``ensure`` calls for one reference share one pull.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import platform
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import grpc

from contract.errors import ImageImportFailed, ImageNotFound
from contract.ids import LOCAL_REGISTRY, resolve_image_name
from sandbox._gen.containerd.api.services.leases.v1 import leases_pb2
from sandbox.connection import Connection
from sandbox.grpc_errors import map_grpc_error, one_line
from sandbox.images import ImageStore, _gc_labels, chain_ids
from sandbox.models import ImageInfo
from sandbox.oci_archive import GOARCH
from sandbox.registry import (
    INDEX_MEDIA_TYPES,
    MEDIA_OCI_MANIFEST,
    Credentials,
    ImagePushFailed,
    Progress,
    Reference,
    RegistryError,
    RegistryOptions,
    RegistrySession,
    digest_of,
    is_registry_reference,
)


def host_platform() -> tuple[str, str]:
    return "linux", GOARCH.get(platform.machine(), platform.machine())


def select_platform(index: dict[str, Any]) -> dict[str, Any] | None:
    """The index entry for this host's platform (linux/amd64 here), if it has one."""
    os_name, arch = host_platform()
    for entry in index.get("manifests", []):
        plat = entry.get("platform", {})
        if plat.get("os") == os_name and plat.get("architecture") == arch:
            return dict(entry)
    return None


class _Guarded:
    """Blob chunks for containerd's Write stream, keeping the registry's error.

    An exception raised inside a gRPC request iterator reaches the caller only
    as a cancelled call; the registry's own reason (digest mismatch, 404, a
    dropped connection) is kept here and raised instead.
    """

    def __init__(
        self, registry: RegistrySession, digest: str, chunks: AsyncIterator[bytes]
    ) -> None:
        self._registry = registry
        self._digest = digest
        self._chunks = chunks
        self.error: RegistryError | None = None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._chunks:
                yield chunk
        except RegistryError as err:
            self.error = err
        except (aiohttp.ClientError, TimeoutError) as err:
            reason = one_line(str(err) or type(err).__name__, 200)
            self.error = self._registry.fail(f"blob {self._digest}: {reason}")


async def pull_image(
    store: ImageStore,
    conn: Connection,
    name: str,
    options: RegistryOptions,
    credentials: Credentials | None = None,
    progress: Progress | None = None,
) -> ImageInfo:
    """Pull ``name`` (``host/repo:tag``) and unpack it; on failure nothing is left behind.

    The image is stored under ``name`` as given (``docker.io/busybox:latest``, not
    the API's ``library/busybox``), the name sandboxes will ask for.
    """
    full = resolve_image_name(name)
    ref = Reference.parse(full)
    lease = await conn.create_lease("pull")
    try:
        async with RegistrySession(ref, options, credentials) as registry:
            info = await _pull(store, registry, full, lease, progress)
    except BaseException:
        await _delete_lease_and_collect(conn, lease)
        raise
    await conn.delete_lease(lease)
    return info


async def _pull(
    store: ImageStore,
    registry: RegistrySession,
    name: str,
    lease: str,
    progress: Progress | None,
) -> ImageInfo:
    ref = registry.ref
    try:
        body, media_type = await registry.get_manifest(ref.reference)
        target = {"mediaType": media_type, "digest": digest_of(body), "size": len(body)}
        manifest_body, manifest_type = body, media_type
        if media_type in INDEX_MEDIA_TYPES:
            await _write_json_blob(store, registry, target, body, lease)
            entry = select_platform(json.loads(body))
            if entry is None:
                raise registry.fail(f"no manifest for {'/'.join(host_platform())} in the index")
            manifest_body, manifest_type = await registry.get_manifest(entry["digest"])
        manifest = json.loads(manifest_body)
        manifest_desc = {
            "mediaType": manifest_type,
            "digest": digest_of(manifest_body),
            "size": len(manifest_body),
        }
        config_body = await registry.get_blob(manifest["config"]["digest"])
        await _write_json_blob(store, registry, manifest["config"], config_body, lease)
        for layer in manifest["layers"]:
            await _fetch_layer(store, registry, layer, lease, progress)
        await _write_json_blob(store, registry, manifest_desc, manifest_body, lease)
        chains = chain_ids(json.loads(config_body)["rootfs"]["diff_ids"])
        await store.unpack(manifest, chains, lease)
        return await store._put_image(name, target, chains[-1])
    except (ImageImportFailed, ValueError, KeyError, TypeError) as err:
        raise registry.fail(f"not a usable image ({err})") from err
    except grpc.aio.AioRpcError as err:
        raise registry.fail(str(map_grpc_error(err, "containerd"))) from err


async def _write_json_blob(
    store: ImageStore, registry: RegistrySession, desc: dict[str, Any], body: bytes, lease: str
) -> None:
    """A manifest, index or config: small, already verified, GC references from its body."""
    registry.verify(desc["digest"], body)
    if await store.hold_content(desc["digest"], lease):
        return
    blob = json.loads(body)
    labels = _gc_labels(blob) if "schemaVersion" in blob else {}

    async def one_chunk() -> AsyncIterator[bytes]:
        yield body

    await store._write_content(desc["digest"], len(body), one_chunk(), labels, lease)


async def _fetch_layer(
    store: ImageStore,
    registry: RegistrySession,
    layer: dict[str, Any],
    lease: str,
    progress: Progress | None,
) -> None:
    digest, size = layer["digest"], int(layer["size"])
    if await store.hold_content(digest, lease):
        if progress:
            progress(digest, size, size)
        return
    chunks = _Guarded(registry, digest, registry.blob_chunks(digest, size, progress))
    try:
        await store._write_content(digest, size, aiter(chunks), {}, lease)
    except grpc.aio.AioRpcError as err:
        if chunks.error is not None:
            raise chunks.error from err
        raise
    if chunks.error is not None:  # containerd took the bytes; the registry's stream failed late
        raise chunks.error


async def _delete_lease_and_collect(conn: Connection, lease: str) -> None:
    """Drop the pull's lease and wait for GC, so its blobs and snapshots are gone."""
    with contextlib.suppress(grpc.aio.AioRpcError):
        await conn.leases.Delete(leases_pb2.DeleteRequest(id=lease, sync=True), metadata=conn.md())


# -- push ------------------------------------------------------------------------------
async def push_image(
    store: ImageStore,
    local_name: str,
    remote_name: str,
    options: RegistryOptions,
    credentials: Credentials | None = None,
    progress: Progress | None = None,
) -> str:
    """Push ``local_name``'s platform manifest, config and layers as ``remote_name``.

    Returns the manifest digest the registry now serves under that tag.
    """
    ref = Reference.parse(resolve_image_name(remote_name))
    info = await store.get(local_name)
    manifest_body = await _platform_manifest_bytes(store, info)
    manifest = json.loads(manifest_body)
    async with RegistrySession(
        ref, options, credentials, push=True, error=ImagePushFailed
    ) as registry:
        for desc in [manifest["config"], *manifest["layers"]]:
            digest, size = desc["digest"], int(desc["size"])
            if not await registry.has_blob(digest):
                await registry.upload_blob(digest, size, store.read_chunks(digest))
            if progress:
                progress(digest, size, size)
        media_type = manifest.get("mediaType") or MEDIA_OCI_MANIFEST
        return await registry.put_manifest(ref.reference, manifest_body, media_type)


async def _platform_manifest_bytes(store: ImageStore, info: ImageInfo) -> bytes:
    """The image's manifest as stored (exact bytes: its digest is its name); for an
    index, the entry of this host's platform."""
    body = await store.read_bytes(info.digest)
    blob = json.loads(body)
    if "manifests" not in blob:
        return body
    entry = select_platform(blob)
    if entry is None:
        raise ImagePushFailed(f"push {info.name}: no manifest for {'/'.join(host_platform())}")
    return await store.read_bytes(entry["digest"])


# -- first use on a node ------------------------------------------------------------------
class Puller:
    """Pull-on-first-use for one node's containerd, one pull per reference at a time."""

    def __init__(self, store: ImageStore, conn: Connection) -> None:
        self._store = store
        self._conn = conn
        self._inflight: dict[str, asyncio.Future[ImageInfo]] = {}
        self.pulls_started = 0  # how many pulls really went to a registry

    async def ensure(
        self,
        name: str,
        options: RegistryOptions,
        credentials: Credentials | None = None,
        progress: Progress | None = None,
    ) -> ImageInfo:
        """The image ``name``, pulled first if it is a registry reference this node lacks."""
        full = resolve_image_name(name)
        try:
            image = await self._store.get(full)
        except ImageNotFound:
            if not is_registry_reference(full, LOCAL_REGISTRY):
                raise
            return await self.pull(full, options, credentials, progress)
        await self._store.touch(image)
        return image

    async def pull(
        self,
        name: str,
        options: RegistryOptions,
        credentials: Credentials | None = None,
        progress: Progress | None = None,
    ) -> ImageInfo:
        """Pull ``name``; callers asking for the same name meanwhile share this pull."""
        full = resolve_image_name(name)
        running = self._inflight.get(full)
        if running is not None:
            return await asyncio.shield(running)
        task = asyncio.ensure_future(
            pull_image(self._store, self._conn, full, options, credentials, progress)
        )
        self._inflight[full] = task
        self.pulls_started += 1
        task.add_done_callback(lambda done: self._forget(full, done))
        return await asyncio.shield(task)

    def _forget(self, name: str, task: asyncio.Future[ImageInfo]) -> None:
        self._inflight.pop(name, None)
        if not task.cancelled():
            task.exception()  # retrieved: every waiter may have been cancelled meanwhile
