"""Push and pull against a real docker-registry, into real containerd (the stack's nodes).

Images are pushed from node-1 and pulled on node-2, which never had them.
"""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from registry_helpers import RegistryServer, push_marked, run_once

from contract.labels import LAST_USED_LABEL
from sandbox import Containerd, SandboxSpec
from sandbox.registry import (
    Credentials,
    ImagePullFailed,
    InvalidReference,
    Reference,
    RegistryOptions,
    RegistrySession,
)
from tests.net import free_port


async def _nothing_left(client: Containerd, name: str, content_before: set[str]) -> None:
    assert name not in {image.name for image in await client.images.list()}
    assert await client.images.content_digests() <= content_before


async def test_pushed_image_is_pulled_on_a_node_without_it_and_runs(
    node1: Containerd,
    node2: Containerd,
    auth_registry: RegistryServer,
    options: RegistryOptions,
    pulled: list[str],
) -> None:
    marker = uuid.uuid4().hex
    ref, local = await push_marked(node1, auth_registry, options, marker)
    seen: dict[str, tuple[int, int]] = {}

    pulled.append(ref)
    image = await node2.pulls.pull(
        ref,
        options,
        auth_registry.credentials,
        progress=lambda d, done, total: seen.update({d: (done, total)}),
    )

    assert image.name == ref and image.digest == local.digest
    assert seen and all(done == total for done, total in seen.values())
    assert await run_once(node2, ref, "cat /marker") == marker


async def test_wrong_password_fails_in_one_line_and_leaves_nothing(
    node1: Containerd,
    node2: Containerd,
    auth_registry: RegistryServer,
    options: RegistryOptions,
) -> None:
    ref, _ = await push_marked(node1, auth_registry, options)
    before = await node2.images.content_digests()

    for credentials, reason in [
        (Credentials("trainer", "wrong"), "unauthorized"),
        (None, "username and password"),
    ]:
        with pytest.raises(ImagePullFailed) as caught:
            await node2.pulls.pull(ref, options, credentials)
        assert "\n" not in str(caught.value) and ref in str(caught.value)
        assert reason in str(caught.value)
    await _nothing_left(node2, ref, before)


async def test_unknown_image_and_bad_reference_fail_in_one_line(
    node2: Containerd,
    open_registry: RegistryServer,
    options: RegistryOptions,
) -> None:
    before = await node2.images.content_digests()
    missing = open_registry.ref("tests/never-pushed", "v1")

    with pytest.raises(ImagePullFailed, match="not found") as caught:
        await node2.pulls.ensure(missing, options)
    assert "\n" not in str(caught.value) and missing in str(caught.value)
    with pytest.raises(InvalidReference, match="Bad_Repo"):
        await node2.pulls.ensure(f"{open_registry.host}/Bad_Repo:v1", options)
    await _nothing_left(node2, missing, before)


async def test_registry_down_fails_the_pull_naming_the_reference(
    node2: Containerd,
    open_registry: RegistryServer,
    options: RegistryOptions,
) -> None:
    nobody = f"127.0.0.1:{free_port()}/tests/down:v1"

    with pytest.raises(ImagePullFailed, match="unreachable") as caught:
        await node2.pulls.pull(nobody, options)
    assert "\n" not in str(caught.value) and nobody in str(caught.value)


async def test_corrupt_layer_in_the_registry_is_refused_and_nothing_is_kept(
    node1: Containerd,
    node2: Containerd,
    open_registry: RegistryServer,
    options: RegistryOptions,
) -> None:
    ref, _ = await push_marked(node1, open_registry, options)
    async with RegistrySession(Reference.parse(ref), options) as registry:
        manifest = json.loads((await registry.get_manifest("v1"))[0])
    marker_layer = manifest["layers"][-1]["digest"]
    blob = open_registry.blob_file(marker_layer)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, other bytes
    blob.write_bytes(bytes(data))
    before = await node2.images.content_digests()
    snapshots_before = set(await node2.snapshot_keys())

    with pytest.raises(ImagePullFailed, match="digest mismatch") as caught:
        await node2.pulls.pull(ref, options)

    assert marker_layer in str(caught.value) and "\n" not in str(caught.value)
    await _nothing_left(node2, ref, before)
    assert set(await node2.snapshot_keys()) <= snapshots_before


async def test_concurrent_first_uses_of_one_image_share_one_pull(
    node1: Containerd,
    node2: Containerd,
    open_registry: RegistryServer,
    options: RegistryOptions,
    pulled: list[str],
) -> None:
    ref, local = await push_marked(node1, open_registry, options)
    started = node2.pulls.pulls_started
    pulled.append(ref)

    images = await asyncio.gather(*(node2.pulls.ensure(ref, options) for _ in range(4)))

    assert {image.digest for image in images} == {local.digest}
    assert node2.pulls.pulls_started == started + 1


async def test_prune_removes_least_recently_used_unused_images_first(
    node1: Containerd,
    node2: Containerd,
    open_registry: RegistryServer,
    options: RegistryOptions,
    pulled: list[str],
) -> None:
    old_ref, _ = await push_marked(node1, open_registry, options)
    new_ref, _ = await push_marked(node1, open_registry, options)
    busy_ref, _ = await push_marked(node1, open_registry, options)
    pulled.extend([old_ref, new_ref, busy_ref])
    for ref in (old_ref, new_ref, busy_ref):
        await node2.pulls.ensure(ref, options)
    await node2.images.set_label(old_ref, LAST_USED_LABEL, "1")  # used long ago
    await node2.images.set_label(busy_ref, LAST_USED_LABEL, "1")
    box = await node2.create_sandbox(f"reg-{uuid.uuid4().hex[:10]}", SandboxSpec(image=busy_ref))
    try:
        names = {image.name: image for image in await node2.images.list()}
        keep = sum([await node2.images.image_bytes(image) for image in names.values()])
        keep -= await node2.images.image_bytes(names[old_ref])
        removed = await node2.images.prune(keep_bytes=keep)
        after = {image.name for image in await node2.images.list()}
    finally:
        await node2.destroy_sandbox(box.id)

    assert [image.name for image in removed] == [old_ref]
    assert {new_ref, busy_ref} <= after and old_ref not in after
    assert all(not name.startswith("corral.local/") for name in (i.name for i in removed))


async def test_prune_to_zero_keeps_local_images_and_those_in_use(
    node2: Containerd,
    node1: Containerd,
    open_registry: RegistryServer,
    options: RegistryOptions,
    pulled: list[str],
) -> None:
    ref, _ = await push_marked(node1, open_registry, options)
    pulled.append(ref)
    await node2.pulls.ensure(ref, options)
    local_before = {i.name for i in await node2.images.list() if i.name.startswith("corral.local/")}

    removed = await node2.images.prune(keep_bytes=0)

    after = {image.name for image in await node2.images.list()}
    assert ref in {image.name for image in removed} and ref not in after
    assert local_before <= after
