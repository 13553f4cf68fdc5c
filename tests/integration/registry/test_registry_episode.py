"""Episodes whose image is a registry reference: the node pulls it on first use."""

from __future__ import annotations

import uuid

import pytest
from registry_helpers import RegistryServer, push_marked

from corral.errors import EpisodeFailed
from corral.sdk import Corral
from sandbox import Containerd
from sandbox.registry import RegistryOptions


async def _image_names(client: Containerd) -> set[str]:
    return {image.name for image in await client.images.list()}


async def test_episode_runs_on_a_node_that_did_not_have_its_image(
    corral: Corral,
    node1: Containerd,
    node2: Containerd,
    open_registry: RegistryServer,
    options: RegistryOptions,
    pulled: list[str],
) -> None:
    marker = uuid.uuid4().hex
    ref, _ = await push_marked(node1, open_registry, options, marker)
    assert ref not in await _image_names(node2)
    pulled.append(ref)

    result = await corral.run_episode({"image": ref, "steps": ["cat /marker"]}, node="node-2")

    assert result.steps[0].stdout == marker
    assert ref in await _image_names(node2)


async def test_episode_of_an_image_it_may_not_pull_fails_in_one_line(
    corral: Corral,
    node1: Containerd,
    node2: Containerd,
    auth_registry: RegistryServer,
    options: RegistryOptions,
) -> None:
    ref, _ = await push_marked(node1, auth_registry, options)  # node workers have no credentials
    bad = f"{auth_registry.host}/Not A Repo:v1"

    for image, reason in [(ref, "username and password"), (bad, "invalid repository")]:
        with pytest.raises(EpisodeFailed) as caught:
            await corral.run_episode({"image": image, "steps": ["true"]}, node="node-2")
        message = str(caught.value)
        assert "\n" not in message and image in message and reason in message
        assert caught.value.result is not None and caught.value.result.steps == []
        assert image not in await _image_names(node2)
