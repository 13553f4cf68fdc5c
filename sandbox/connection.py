"""The gRPC channel to one containerd, its service stubs and call metadata.

containerd scopes every call by the ``containerd-namespace`` metadata key and
protects resources from garbage collection with ``containerd-lease``.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc

from sandbox import tracing
from sandbox._gen.containerd.api.services.containers.v1 import containers_pb2, containers_pb2_grpc
from sandbox._gen.containerd.api.services.content.v1 import content_pb2_grpc
from sandbox._gen.containerd.api.services.diff.v1 import diff_pb2_grpc
from sandbox._gen.containerd.api.services.events.v1 import events_pb2_grpc
from sandbox._gen.containerd.api.services.images.v1 import images_pb2_grpc
from sandbox._gen.containerd.api.services.introspection.v1 import introspection_pb2_grpc
from sandbox._gen.containerd.api.services.leases.v1 import leases_pb2, leases_pb2_grpc
from sandbox._gen.containerd.api.services.namespaces.v1 import namespace_pb2_grpc
from sandbox._gen.containerd.api.services.snapshots.v1 import snapshots_pb2_grpc
from sandbox._gen.containerd.api.services.tasks.v1 import tasks_pb2_grpc
from sandbox._gen.containerd.api.services.version.v1 import version_pb2_grpc

Metadata = tuple[tuple[str, str], ...]

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
LEASE_TTL = timedelta(minutes=15)  # a crashed client's lease expires by itself
DEFAULT_SNAPSHOTTER = "overlayfs"


class Connection:
    """Channel + stubs + namespace; shared by the client, images and sandboxes."""

    def __init__(
        self,
        socket: str,
        namespace: str,
        snapshotter: str = DEFAULT_SNAPSHOTTER,
        runc_root: str | None = None,
    ) -> None:
        self.socket = socket
        self.namespace = namespace
        self.snapshotter = snapshotter
        # runc's state dir, per daemon: with the default (/run/containerd/runc)
        # two daemons' sandboxes of the same namespace and id would collide.
        self.runc_root = runc_root or str(Path(socket).resolve().parent / "runc")
        self.channel = grpc.aio.insecure_channel(
            f"unix://{socket}",
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                # reconnect quickly after a containerd restart (default backoff reaches 120 s)
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.min_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 1000),
            ],
            interceptors=tracing.interceptors(),
        )
        ch: Any = self.channel
        self.containers = containers_pb2_grpc.ContainersStub(ch)
        self.content = content_pb2_grpc.ContentStub(ch)
        self.diff = diff_pb2_grpc.DiffStub(ch)
        self.events = events_pb2_grpc.EventsStub(ch)
        self.images = images_pb2_grpc.ImagesStub(ch)
        self.introspection = introspection_pb2_grpc.IntrospectionStub(ch)
        self.leases = leases_pb2_grpc.LeasesStub(ch)
        self.namespaces = namespace_pb2_grpc.NamespacesStub(ch)
        self.snapshots = snapshots_pb2_grpc.SnapshotsStub(ch)
        self.tasks = tasks_pb2_grpc.TasksStub(ch)
        self.version = version_pb2_grpc.VersionStub(ch)

    def md(self, lease: str | None = None) -> Metadata:
        if lease is None:
            return (("containerd-namespace", self.namespace),)
        return (("containerd-namespace", self.namespace), ("containerd-lease", lease))

    async def create_lease(self, purpose: str) -> str:
        expire = datetime.now(UTC) + LEASE_TTL
        lease_id = f"corral-{purpose}-{uuid.uuid4().hex[:12]}"
        await self.leases.Create(
            leases_pb2.CreateRequest(
                id=lease_id,
                labels={"containerd.io/gc.expire": expire.strftime("%Y-%m-%dT%H:%M:%SZ")},
            ),
            metadata=self.md(),
        )
        return lease_id

    async def delete_lease(self, lease_id: str) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError):
            await self.leases.Delete(leases_pb2.DeleteRequest(id=lease_id), metadata=self.md())

    @contextlib.asynccontextmanager
    async def lease(self, purpose: str) -> AsyncIterator[str]:
        """Hold a lease for the block: nothing made under it is collected meanwhile."""
        lease_id = await self.create_lease(purpose)
        try:
            yield lease_id
        finally:
            await self.delete_lease(lease_id)

    async def list_containers(self, filters: list[str] | None = None) -> list[Any]:
        """Container records, streamed one message each: a unary `List` fails
        past gRPC's 16 MiB message limit (each record carries its OCI spec,
        about 7 KiB: some 2,300 sandboxes)."""
        call = self.containers.ListStream(
            containers_pb2.ListContainersRequest(filters=filters or []), metadata=self.md()
        )
        return [message.container async for message in call]

    async def close(self) -> None:
        await self.channel.close()


def monotonic_ms() -> float:
    return time.monotonic() * 1000
