"""Images the registry tests make themselves: busybox plus a layer of their own."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
import tempfile
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from sandbox import Containerd, SandboxSpec
from sandbox.models import ImageInfo
from sandbox.oci_archive import build_busybox_rootfs, write_oci_archive
from sandbox.registry import Credentials, Reference, RegistryOptions, RegistrySession, digest_of
from sandbox.transfer import push_image


@dataclass
class RegistryServer:
    host: str  # localhost:PORT
    storage: Path
    process: subprocess.Popen[bytes]
    credentials: Credentials | None = None

    def ref(self, repository: str, tag: str = "latest") -> str:
        return f"{self.host}/{repository}:{tag}"

    def blob_file(self, digest: str) -> Path:
        """Where the filesystem driver keeps a blob's bytes (to corrupt one on purpose)."""
        hexdigest = digest.split(":", 1)[1]
        return self.storage / "docker/registry/v2/blobs/sha256" / hexdigest[:2] / hexdigest / "data"


async def marked_image(client: Containerd, name: str, marker: str | None = None) -> ImageInfo:
    """busybox with ``/marker`` holding ``marker`` (unique by default) as a second layer.

    The marker layer's digest is new, so a node that pulls the image really
    fetches that layer instead of finding it in its content store.
    """
    marker = marker or uuid.uuid4().hex
    with tempfile.TemporaryDirectory(prefix="corral-registry-test-") as tmp:
        rootfs = build_busybox_rootfs(Path(tmp) / "rootfs")
        extra = Path(tmp) / "extra"
        extra.mkdir()
        (extra / "marker").write_text(marker)
        archive = write_oci_archive(Path(tmp) / "image.tar", [rootfs, extra], name)
        images = await client.images.import_archive(archive)
    return next(image for image in images if image.name == name)


async def push_marked(
    node1: Containerd, registry: RegistryServer, options: RegistryOptions, marker: str | None = None
) -> tuple[str, ImageInfo]:
    """A fresh marked image on node-1, pushed to ``registry``; (remote ref, local image)."""
    repo = f"tests/img-{uuid.uuid4().hex[:8]}"
    local = await marked_image(node1, f"corral.local/{repo}:v1", marker)
    ref = registry.ref(repo, "v1")
    await push_image(node1.images, local.name, ref, options, registry.credentials)
    await node1.images.remove(local.name)
    return ref, local


def layer_tar(files: dict[str, str]) -> bytes:
    """An uncompressed layer tar holding ``files`` (path -> text)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


async def put_raw(
    ref: str,
    options: RegistryOptions,
    credentials: Credentials | None,
    blobs: list[bytes],
    manifest: dict[str, object],
    media_type: str,
) -> str:
    """Upload ``blobs`` and ``manifest`` as they are (for shapes push_image never makes)."""
    reference = Reference.parse(ref)
    async with RegistrySession(reference, options, credentials, push=True) as registry:
        for blob in blobs:
            digest = digest_of(blob)
            if not await registry.has_blob(digest):
                await registry.upload_blob(digest, len(blob), _one(blob))
        body = json.dumps(manifest).encode()
        return await registry.put_manifest(reference.reference, body, media_type)


async def _one(blob: bytes) -> AsyncIterator[bytes]:
    yield blob


async def run_once(client: Containerd, image: str, command: str) -> str:
    """stdout of ``command`` in a fresh sandbox of ``image``, which is destroyed after."""
    box = await client.create_sandbox(f"reg-{uuid.uuid4().hex[:10]}", SandboxSpec(image=image))
    try:
        result = await box.exec(command)
    finally:
        await client.destroy_sandbox(box.id)
    return result.stdout
