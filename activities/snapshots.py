"""Snapshot activities: commit a sandbox as an image, and bring a snapshot to this node.

A snapshot made on one node is used on another in one of two ways:
  * a registry is configured (`registry:` in temporal-dev.yaml): the snapshot
    is named `<registry>/corral/snapshots/...`, pushed once made, and a node
    that lacks it pulls it in `provision` like any registry image;
  * the local rig (all nodes' containerd on one machine): the node that lacks
    it copies the blobs from a sibling node's containerd (`copy_image`).
Temporal payloads are never used for layers: they are too big.

Without a registry a snapshot is staged (sandbox/snapshot.py): the activity
returns once the sandbox's writes are committed as a copy, and its image is
made whole in the background once the node is quiet after the snapshot's
first users (a fork's children) have started; a worker that died first makes
its staged images whole when it starts again (`resume_staged`). With a
registry the image is made whole and pushed before the activity returns: a
node elsewhere pulls it at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from temporalio import activity

from activities.foreground import Foreground
from activities.glue import heartbeating, mapped
from contract.errors import ContainerdUnavailable, CorralError, ImageNotFound
from contract.ids import is_local_snapshot, resolve_image_name, service_snapshot_ref
from contract.labels import (
    LAYER_BYTES_LABEL,
    PARENT_EPISODE_LABEL,
    SERVICE_NAME_LABEL,
    SERVICE_OF_LABEL,
    SNAPSHOT_NODE_LABEL,
    STAGED_LABEL,
)
from contract.models import FetchImageInput, SnapshotInput, SnapshotResult
from sandbox import Containerd
from sandbox.client import KeyedLocks
from sandbox.models import ImageInfo
from sandbox.registry import RegistryOptions
from sandbox.snapshot import (
    commit_sandbox,
    copy_image,
    materialize,
    paused_all,
    put_image,
    stage_sandbox,
)
from sandbox.transfer import push_image

log = logging.getLogger(__name__)

# A fork's children are placed and started within about a second of the snapshot;
# its layer is written after them (and after any step then running: Foreground).
MATERIALIZE_AFTER_S = 2.0


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
        foreground: Foreground | None = None,
        materialize_after_s: float = MATERIALIZE_AFTER_S,
    ) -> None:
        self.node = node
        self._containerd = containerd
        self._peers = peers
        self._registry = registry
        self._registry_options = registry_options or RegistryOptions()
        # One copy of an image at a time: a fork's children placed on this node all
        # fetch its snapshot at once, and concurrent writers of one blob collide.
        self._copying = KeyedLocks()
        self._foreground = foreground
        self._materialize_after_s = materialize_after_s
        self._materializing: set[asyncio.Task[None]] = set()

    @activity.defn(name="corral.snapshot")
    async def snapshot(self, input: SnapshotInput) -> SnapshotResult:
        """Commit the sandbox's writable layer as image ``input.ref``, and each of
        its services' as ``<ref>.<service>``, at one moment (idempotent by ref)."""
        started = time.monotonic()
        services = await mapped(self._services_of(input.sandbox_id)) if input.services else {}
        targets = {
            input.sandbox_id: input.ref,
            **{sid: service_snapshot_ref(input.ref, name) for name, sid in services.items()},
        }
        labels = {PARENT_EPISODE_LABEL: input.episode_id, SNAPSHOT_NODE_LABEL: self.node}
        infos = await heartbeating(mapped(self._commit_all(targets, labels)))
        refs = dict(targets)  # pushed under the registry's name when there is one
        for sid, info in infos.items():
            if self._registry:
                remote = f"{self._registry}/{targets[sid]}"
                refs[sid] = await heartbeating(mapped(self._share(info, remote)))
            else:
                self._materialize_soon(info.name, self._materialize_after_s)
        agent = infos[input.sandbox_id]
        return SnapshotResult(
            ref=refs[input.sandbox_id],
            image=agent.name,
            node=self.node,
            sandbox_id=input.sandbox_id,
            seconds=time.monotonic() - started,
            layer_bytes=int(agent.labels.get(LAYER_BYTES_LABEL, "0")),
            services={name: refs[sid] for name, sid in services.items()},
        )

    async def _services_of(self, sandbox_id: str) -> dict[str, str]:
        """The sandbox's services: name -> their sandbox id (activities/services.py)."""
        found = await self._containerd.list_sandboxes({SERVICE_OF_LABEL: sandbox_id})
        return {info.labels[SERVICE_NAME_LABEL]: info.id for info in found}

    async def _commit_all(
        self, targets: dict[str, str], labels: dict[str, str]
    ) -> dict[str, ImageInfo]:
        """Each sandbox of ``targets`` as its image, all paused at once: made whole
        and pushed with a registry, else staged (the layers follow)."""
        conn, images = self._containerd.connection, self._containerd.images
        commit = commit_sandbox if self._registry else stage_sandbox
        async with paused_all(conn, list(targets)):
            return {
                sid: await commit(conn, images, sid, ref, labels, pause=False)
                for sid, ref in targets.items()
            }

    def _materialize_soon(self, image: str, after_s: float) -> None:
        """Make staged ``image`` whole in the background (its layer, for copies,
        pushes and snapshots on top of it); its users need not wait for that."""
        task = asyncio.create_task(self._materialize(image, after_s))
        self._materializing.add(task)
        task.add_done_callback(self._materializing.discard)

    async def _materialize(self, image: str, after_s: float) -> None:
        await asyncio.sleep(after_s)
        if self._foreground is not None:
            await self._foreground.quiet()
        client = self._containerd
        try:
            async with self._copying.hold(image):
                await materialize(client.connection, client.images, image)
        except ImageNotFound:
            pass  # removed meanwhile (its episode ended); its copy's lease expires
        except CorralError as err:
            log.warning("snapshot %s on %s: its layer was not written: %s", image, self.node, err)
        except Exception:
            log.exception("snapshot %s on %s: its layer was not written", image, self.node)

    async def resume_staged(self) -> list[str]:
        """Make whole, in the background, the staged images an earlier worker left."""
        images = await self._containerd.images.list()
        staged = [info.name for info in images if STAGED_LABEL in info.labels]
        for name in staged:
            self._materialize_soon(name, 0.0)
        return staged

    async def settled(self) -> None:
        """Wait for the background materializations."""
        while self._materializing:
            await asyncio.gather(*self._materializing, return_exceptions=True)

    async def stop(self) -> None:
        """Cut the background materializations short: the next worker resumes them."""
        for task in self._materializing:
            task.cancel()
        await self.settled()

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
            # A staged snapshot's layer is written now, not when its node is next quiet:
            # a child here waits for it (a second writer on that node meets the same result).
            await materialize(source.connection, source.images, image)
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
