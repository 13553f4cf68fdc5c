"""Snapshot images collected on a real node (sandbox/snapshot_gc.py): snapshots made
through the episode path, then the node's collector run with a tiny retention.

An unreferenced snapshot goes (its manifest blob too, by containerd's garbage
collection); one a live sandbox runs on stays, and so does the snapshot that one
was made from, although no container uses it. Once their episodes end, they go.
"""

from __future__ import annotations

import contextlib
from contextlib import AsyncExitStack

import pytest
from episode_helpers import sandbox_exists

from contract.config import StackConfig
from corral.errors import EpisodeError
from corral.sdk import Corral, Episode
from sandbox.client import Containerd
from sandbox.snapshot_gc import collect_snapshots

pytestmark = pytest.mark.integration

NODE = "node-1"
TINY_RETENTION_S = 0.001  # anything made before the call is old enough


async def _names(client: Containerd) -> set[str]:
    return {image.name for image in await client.images.list()}


async def test_unreferenced_snapshots_go_referenced_ones_and_their_bases_stay(
    corral: Corral, stack_config: StackConfig
) -> None:
    started: list[Episode] = []

    async def start(image: str) -> Episode:
        episode = await corral.start_episode({"image": image, "interactive": True}, node=NODE)
        started.append(episode)
        return episode

    async with AsyncExitStack() as cleanup:
        node = await Containerd.connect(
            str(stack_config.containerd_socket(NODE)),
            namespace=stack_config.nodes.containerd_namespace,
        )
        cleanup.push_async_callback(node.close)

        async def close_all() -> None:  # a failed assertion must not leave sandboxes behind
            for episode in started:
                with contextlib.suppress(EpisodeError):
                    await episode.close()

        cleanup.push_async_callback(close_all)

        parent = await start("busybox")
        await parent.write_file("/data/a", "a\n")
        free = await parent.snapshot("gc-free")
        await parent.write_file("/data/b", "b\n")
        base = await parent.snapshot("gc-base")
        child = await start(base.ref)
        await child.write_file("/data/c", "c\n")
        tip = await child.snapshot("gc-tip")
        finished = await child.finish()
        assert finished.outcome == "completed", finished.reason
        assert not await sandbox_exists(stack_config, finished.sandbox_id)
        # Only the grandchild's sandbox uses a snapshot now: the tip.
        grandchild = await start(tip.ref)
        assert (await grandchild.exec("true")).ok  # its sandbox exists: it uses the tip now
        assert {free.node, base.node, tip.node} == {NODE}
        free_manifest = (await node.images.get(free.image)).digest
        assert {free.image, base.image, tip.image} <= await _names(node)

        removed = await collect_snapshots(node.connection, TINY_RETENTION_S)

        assert free.image in removed
        assert base.image not in removed and tip.image not in removed
        names = await _names(node)
        assert free.image not in names
        assert {base.image, tip.image, "corral.local/busybox:latest"} <= names
        assert all(name.startswith("corral.local/corral/snapshots/") for name in removed)
        # The image record went and containerd's collector took its blobs.
        assert free_manifest not in await node.images.content_digests()
        # The grandchild runs on, on its whole lineage.
        files = await grandchild.exec("cat /data/a /data/b /data/c")
        assert files.stdout == "a\nb\nc\n"
        # A retention of 0 collects nothing, whatever the age.
        assert await collect_snapshots(node.connection, 0) == []

        for episode in (grandchild, parent):
            result = await episode.finish()
            assert result.outcome == "completed", result.reason
            assert not await sandbox_exists(stack_config, result.sandbox_id)
        removed = await collect_snapshots(node.connection, TINY_RETENTION_S)
        assert {base.image, tip.image} <= set(removed)
        assert not {base.image, tip.image} & await _names(node)
