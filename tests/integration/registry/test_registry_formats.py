"""Image shapes a registry serves that `corral image build` never makes: OCI indexes
(resolved to this host's platform) and zstd-compressed layers."""

from __future__ import annotations

import json
import uuid

import zstandard
from registry_helpers import RegistryServer, layer_tar, marked_image, put_raw, run_once

from sandbox import Containerd
from sandbox.models import ImageInfo
from sandbox.oci_archive import MEDIA_CONFIG, MEDIA_INDEX, MEDIA_MANIFEST, image_config
from sandbox.registry import Reference, RegistryOptions, RegistrySession, digest_of
from sandbox.transfer import host_platform, push_image

MEDIA_LAYER_ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"


def _descriptor(media_type: str, blob: bytes, **extra: object) -> dict[str, object]:
    return {"mediaType": media_type, "digest": digest_of(blob), "size": len(blob), **extra}


async def _manifest_bytes(ref: str, options: RegistryOptions) -> bytes:
    reference = Reference.parse(ref)
    async with RegistrySession(reference, options) as registry:
        return (await registry.get_manifest(reference.reference))[0]


async def test_index_is_resolved_to_this_hosts_platform(
    node1: Containerd,
    node2: Containerd,
    open_registry: RegistryServer,
    options: RegistryOptions,
    pulled: list[str],
) -> None:
    repo = f"tests/multi-{uuid.uuid4().hex[:8]}"
    os_name, arch = host_platform()
    other = "arm64" if arch != "arm64" else "amd64"
    entries = []
    for plat in (other, arch):  # the foreign platform first: it must be skipped
        local = await marked_image(node1, f"corral.local/{repo}:{plat}", f"built for {plat}")
        ref = open_registry.ref(repo, plat)
        await push_image(node1.images, local.name, ref, options)
        await node1.images.remove(local.name)
        body = await _manifest_bytes(ref, options)
        entries.append(
            _descriptor(MEDIA_MANIFEST, body, platform={"os": os_name, "architecture": plat})
        )
    index_ref = open_registry.ref(repo, "multi")
    await put_raw(
        index_ref,
        options,
        None,
        [],
        {"schemaVersion": 2, "mediaType": MEDIA_INDEX, "manifests": entries},
        MEDIA_INDEX,
    )

    pulled.append(index_ref)
    image = await node2.pulls.pull(index_ref, options)

    assert image.media_type == MEDIA_INDEX
    assert await run_once(node2, index_ref, "cat /marker") == f"built for {arch}"


async def test_zstd_layer_is_pulled_and_unpacked(
    node2: Containerd,
    node1: Containerd,
    busybox_local: ImageInfo,
    open_registry: RegistryServer,
    options: RegistryOptions,
    pulled: list[str],
) -> None:
    base = await node1.images._manifest_from_store(busybox_local)
    base_config = json.loads(await node1.images.read_bytes(base["config"]["digest"]))
    base_layer = await node1.images.read_bytes(base["layers"][0]["digest"])
    marker = uuid.uuid4().hex
    tar = layer_tar({"marker": marker})
    zstd_layer = zstandard.ZstdCompressor().compress(tar)
    config = json.dumps(
        image_config([*base_config["rootfs"]["diff_ids"], digest_of(tar)], cmd=["/bin/sh"])
    ).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": _descriptor(MEDIA_CONFIG, config),
        "layers": [base["layers"][0], _descriptor(MEDIA_LAYER_ZSTD, zstd_layer)],
    }
    ref = open_registry.ref(f"tests/zstd-{uuid.uuid4().hex[:8]}", "v1")
    await put_raw(ref, options, None, [base_layer, zstd_layer, config], manifest, MEDIA_MANIFEST)

    pulled.append(ref)
    await node2.pulls.pull(ref, options)

    assert await run_once(node2, ref, "cat /marker") == marker
