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

from activities.glue import heartbeating, mapped
from contract.errors import ContainerdUnavailable, ImageNotFound
from contract.ids import is_local_snapshot, resolve_image_name
from contract.labels import LAYER_BYTES_LABEL, PARENT_EPISODE_LABEL, SNAPSHOT_NODE_LABEL
from contract.models import FetchImageInput, SnapshotInput, SnapshotResult
from sandbox import Containerd
from sandbox.client import KeyedLocks
from sandbox.models import ImageInfo
from sandbox.registry import RegistryOptions
from sandbox.snapshot import commit_sandbox, copy_image, put_image
from sandbox.transfer import push_image


class SnapshotActivities:
    """One per node worker; ``peers`` maps sibling node names to their containerd sockets;
    with ``registry`` (host[:port]) snapshots are pushed there and named after it."""

    def __init__(
        self,
        node: str,
        containerd: Containerd,
        peers: dict[str, Path],
        *,
        registry: str | None = None,
        registry_options: RegistryOptions | None = None,
    ) -> None:
        self.node = node
        self._containerd = containerd
        self._peers = peers
        self._registry = registry
        self._registry_options = registry_options or RegistryOptions()
        # One copy of an image at a time: a fork's children placed on this node all
        # fetch its snapshot at once, and concurrent writers of one blob collide.
        self._copying = KeyedLocks()

    @activity.defn(name="corral.snapshot")
    async def snapshot(self, input: SnapshotInput) -> SnapshotResult:
        """Commit the sandbox's writable layer as image ``input.ref`` (idempotent by ref)."""
        started = time.monotonic()
        labels = {PARENT_EPISODE_LABEL: input.episode_id, SNAPSHOT_NODE_LABEL: self.node}
        client = self._containerd
        info = await heartbeating(
            mapped(
                commit_sandbox(
                    client.connection, client.images, input.sandbox_id, input.ref, labels
                )
            )
        )
        ref = input.ref
        if self._registry:
            ref = await heartbeating(mapped(self._share(info, f"{self._registry}/{input.ref}")))
        return SnapshotResult(
            ref=ref,
            image=info.name,
            node=self.node,
            sandbox_id=input.sandbox_id,
            seconds=time.monotonic() - started,
            layer_bytes=int(info.labels.get(LAYER_BYTES_LABEL, "0")),
        )

    async def _share(self, info: ImageInfo, remote: str) -> str:
        """Tag the snapshot under its registry name (this node then needs no pull) and push."""
        client = self._containerd
        target = {"mediaType": info.media_type, "digest": info.digest, "size": info.size}
        await put_image(
            client.connection, resolve_image_name(remote), target, info.chain_id or "", info.labels
        )
        options = self._registry_options
        await push_image(client.images, info.name, remote, options, options.credentials)
        return remote

    @activity.defn(name="corral.fetch_image")
    async def fetch_image(self, input: FetchImageInput) -> bool:
        """Bring a snapshot image to this node; False when it was here already."""
        return await heartbeating(mapped(self.ensure_image(input.image, input.from_node)))

    async def ensure_image(self, image: str, from_node: str = "") -> bool:
        """Copy snapshot ``image`` from a sibling node if this node lacks it.

        Images that are not local snapshots (a pushed one is pulled), or that no
        sibling holds, are left to provision (a registry pull, or ImageNotFound).
        """
        if not is_local_snapshot(image) or await self._has(self._containerd, image):
            return False
        async with self._copying.hold(image):
            if await self._has(self._containerd, image):
                return False  # another child's fetch brought it meanwhile
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
