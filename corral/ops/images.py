"""Images on the stack's nodes (`corral image ...`): build, import, pull, push,
list with their lineage, prune and remove, each on every node of this machine
unless one is named.

Straight on each node's containerd, without Temporal: the functions that act on
several nodes yield one `(node, result)` as each node is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract.config import StackConfig
from contract.errors import CorralError
from contract.ids import resolve_image_name
from contract.labels import PARENT_EPISODE_LABEL
from sandbox.client import Containerd
from sandbox.models import ImageInfo
from sandbox.oci_archive import build_busybox_image
from sandbox.registry import credentials_from, registry_options
from sandbox.transfer import push_image as _push

# (layer digest, bytes done, bytes total): what a pull or push reports per layer.
LayerReport = Callable[[str, int, int], None]
# label -> a context in which transfers report to one display (a node's, a push's).
LayerProgress = Callable[[str], AbstractContextManager[LayerReport]]


class NodeUnavailable(CorralError):
    """The node named is not one of this stack's, or its containerd is not running."""


@dataclass(frozen=True)
class NodeImage:
    """One image on one node."""

    node: str
    info: ImageInfo

    @property
    def parent_episode(self) -> str:
        """The episode a snapshot image was committed from ('' for other images)."""
        return self.info.labels.get(PARENT_EPISODE_LABEL, "")

    def to_dict(self) -> dict[str, Any]:
        """The node and the image's fields, flat (`corral image ls --json`)."""
        return {"node": self.node, **self.info.model_dump()}


@dataclass(frozen=True)
class BuiltImage:
    name: str
    layers: int
    seconds: float


@dataclass(frozen=True)
class PushedImage:
    node: str
    local: str  # the full local name pushed
    remote: str
    digest: str


def target_nodes(config: StackConfig, node: str | None = None) -> list[str]:
    """`[node]`, or every node of this stack when none is named."""
    return [node] if node else config.node_names()


@contextlib.asynccontextmanager
async def node_client(config: StackConfig, node: str) -> AsyncIterator[Containerd]:
    """A containerd client of this machine's node `node`, in the stack's namespace;
    `NodeUnavailable` when there is no such node or its containerd is not running."""
    if node not in config.node_names():
        raise NodeUnavailable(f"node {node!r} is not one of {', '.join(config.node_names())}")
    socket = config.containerd_socket(node)
    if not socket.exists():
        raise NodeUnavailable(
            f"containerd of {node} is not running ({socket} missing); run `corral up`"
        )
    async with await Containerd.connect(
        str(socket), namespace=config.nodes.containerd_namespace
    ) as client:
        yield client


async def build_busybox(
    config: StackConfig, *, name: str | None = None, node: str | None = None
) -> AsyncIterator[tuple[str, ImageInfo]]:
    """Build the busybox image locally (no registry needed) and import it on each node."""
    full = resolve_image_name(name or "busybox")
    for each in target_nodes(config, node):
        async with node_client(config, each) as client:
            info = await build_busybox_image(client, full)
        yield each, info


async def build_debian(
    config: StackConfig,
    packages: Sequence[str] = (),
    *,
    name: str | None = None,
    node: str | None = None,
    say: Callable[[str], None] | None = None,
) -> BuiltImage:
    """Build a Debian image with `packages` (debootstrap, cached outside the stack's
    state in `$CORRAL_CACHE_DIR` or `<root>/.cache`, so it outlives `corral down`)
    and import it on each node. `say` is told what is built, once."""
    from sandbox.debian import build_debian_image, write_debian_archive

    cache = Path(os.environ.get("CORRAL_CACHE_DIR") or config.root / ".cache")
    full = resolve_image_name(
        name or ("debian-" + "-".join(sorted(packages)) if packages else "debian")
    )
    started = time.monotonic()
    if say is not None:
        say(f"building {full} (debootstrap, cached in {cache})…")
    built = await asyncio.to_thread(build_debian_image, cache / "debian", list(packages))
    with tempfile.TemporaryDirectory(prefix="corral-image-") as tmp:
        archive = await asyncio.to_thread(
            write_debian_archive, built, Path(tmp) / "image.tar", full
        )
        for each in target_nodes(config, node):
            async with node_client(config, each) as client:
                await client.images.import_archive(archive)
    return BuiltImage(full, len(built.layers), time.monotonic() - started)


async def import_archive(
    config: StackConfig, archive: Path, *, node: str | None = None
) -> AsyncIterator[tuple[str, ImageInfo]]:
    """Import an OCI image archive (tar) on each node: every image it holds."""
    for each in target_nodes(config, node):
        async with node_client(config, each) as client:
            for info in await client.images.import_archive(archive):
                yield each, info


async def list_images(config: StackConfig, *, node: str | None = None) -> list[NodeImage]:
    """Every image of each node, with its labels (a snapshot's names its episode)."""
    images: list[NodeImage] = []
    for each in target_nodes(config, node):
        async with node_client(config, each) as client:
            images += [NodeImage(each, info) for info in await client.images.list()]
    return images


async def remove_image(
    config: StackConfig, name: str, *, node: str | None = None
) -> AsyncIterator[tuple[str, str]]:
    """Remove image `name` from each node; yields (node, the full name removed)."""
    full = resolve_image_name(name)
    for each in target_nodes(config, node):
        async with node_client(config, each) as client:
            await client.images.remove(full)
        yield each, full


async def pull_image(
    config: StackConfig,
    ref: str,
    *,
    node: str | None = None,
    username: str | None = None,
    password: str | None = None,
    progress: LayerProgress | None = None,
) -> AsyncIterator[tuple[str, ImageInfo]]:
    """Pull `ref` (host[:port]/repo[:tag|@digest]) from its registry and unpack it
    on each node. Without `username`, the stack's registry credentials apply
    (`$CORRAL_REGISTRY_USERNAME`); `progress(node)` shows each node's layers."""
    options = registry_options(config.registry)
    credentials = credentials_from(username, password)
    for each in target_nodes(config, node):
        async with node_client(config, each) as client:
            with _progress(progress, each) as report:
                info = await client.pulls.pull(ref, options, credentials, report)
        yield each, info


async def push_image(
    config: StackConfig,
    local_ref: str,
    remote_ref: str,
    *,
    node: str | None = None,
    username: str | None = None,
    password: str | None = None,
    progress: LayerProgress | None = None,
) -> PushedImage:
    """Push `local_ref`, an image node `node` has (default: the first), to a registry
    as `remote_ref`; credentials as for `pull_image`."""
    options = registry_options(config.registry)
    credentials = credentials_from(username, password)
    source = node or config.node_names()[0]
    async with node_client(config, source) as client:
        with _progress(progress, "push") as report:
            digest = await _push(client.images, local_ref, remote_ref, options, credentials, report)
    return PushedImage(source, resolve_image_name(local_ref), remote_ref, digest)


async def prune_images(
    config: StackConfig, *, keep_bytes: int = 0, node: str | None = None
) -> list[NodeImage]:
    """Remove least-recently-used registry images no sandbox uses (local images
    stay) until those left take at most `keep_bytes`; the images removed."""
    removed: list[NodeImage] = []
    for each in target_nodes(config, node):
        async with node_client(config, each) as client:
            removed += [NodeImage(each, info) for info in await client.images.prune(keep_bytes)]
    return removed


def _progress(
    progress: LayerProgress | None, label: str
) -> AbstractContextManager[LayerReport | None]:
    return progress(label) if progress is not None else contextlib.nullcontext(None)
