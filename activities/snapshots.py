"""Snapshot activities: commit a sandbox as an image, and bring a snapshot to this node.

A snapshot made on one node is used on another in one of two ways:
  * a registry is configured (`registry:` in temporal-dev.yaml): the snapshot
    is named `<registry>/corral/snapshots/...`, pushed once made, and a node
    that lacks it pulls it in `provision` like any registry image;
  * the local rig (all nodes' containerd on one machine): the node that lacks
    it copies the blobs from a sibling node's containerd (`copy_image`).
Temporal payloads are never used for layers: they are too big.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from temporalio import activity

from activities.models import FetchImageInput, SnapshotInput, SnapshotResult
from activities.node import _heartbeating, _mapped
from sandbox import Containerd
from sandbox.errors import ContainerdUnavailable, ImageNotFound
from sandbox.images import resolve_image_name
from sandbox.snapshot import (
    LAYER_BYTES_LABEL,
    NODE_LABEL,
    PARENT_EPISODE_LABEL,
    commit_sandbox,
    copy_image,
    is_snapshot_ref,
)


class SnapshotActivities:
    """One per node worker; ``peers`` maps sibling node names to their containerd sockets."""

    def __init__(self, node: str, containerd: Containerd, peers: dict[str, Path]) -> None:
        self.node = node
        self._containerd = containerd
        self._peers = peers

    @activity.defn(name="corral.snapshot")
    async def snapshot(self, input: SnapshotInput) -> SnapshotResult:
        """Commit the sandbox's writable layer as image ``input.ref`` (idempotent by ref)."""
        started = time.monotonic()
        labels = {PARENT_EPISODE_LABEL: input.episode_id, NODE_LABEL: self.node}
        client = self._containerd
        info = await _heartbeating(
            _mapped(
                commit_sandbox(
                    client.connection, client.images, input.sandbox_id, input.ref, labels
                )
            )
        )
        return SnapshotResult(
            ref=input.ref,
            image=info.name,
            node=self.node,
            sandbox_id=input.sandbox_id,
            seconds=time.monotonic() - started,
            layer_bytes=int(info.labels.get(LAYER_BYTES_LABEL, "0")),
        )

    @activity.defn(name="corral.fetch_image")
    async def fetch_image(self, input: FetchImageInput) -> bool:
        """Bring a snapshot image to this node; False when it was here already."""
        return await _heartbeating(_mapped(self.ensure_image(input.image, input.from_node)))

    async def ensure_image(self, image: str, from_node: str = "") -> bool:
        """Copy snapshot ``image`` from a sibling node if this node lacks it.

        Images that are not snapshots, or that no sibling holds, are left to
        provision (a registry pull, or its ImageNotFound).
        """
        if not is_snapshot_ref(image) or await self._has(self._containerd, image):
            return False
        peers = [from_node] if from_node in self._peers else sorted(self._peers)
        for peer in peers:
            if await self._copy_from(peer, image):
                return True
        return False

    async def _copy_from(self, peer: str, image: str) -> bool:
        socket = self._peers[peer]
        if not socket.exists():
            return False  # that node's containerd is on another host
        try:
            source = await Containerd.connect(str(socket), self._containerd.namespace)
        except ContainerdUnavailable:
            return False
        async with source:
            if not await self._has(source, image):
                return False
            activity.logger.info("copying %s from %s to %s", image, peer, self.node)
            dst = self._containerd
            await copy_image(
                source.connection,
                source.images,
                dst.connection,
                dst.images,
                resolve_image_name(image),
            )
            return True

    @staticmethod
    async def _has(client: Containerd, image: str) -> bool:
        with contextlib.suppress(ImageNotFound):
            await client.images.get(image)
            return True
        return False

    def activities(self) -> list[Callable[..., Any]]:
        return [self.snapshot, self.fetch_image]
