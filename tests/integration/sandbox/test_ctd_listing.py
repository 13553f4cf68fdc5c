"""Listing past gRPC's 16 MiB message limit: at density a unary containers
List fails (each record carries its OCI spec); list_sandboxes streams."""

from __future__ import annotations

import json
import uuid

from google.protobuf import any_pb2

from contract.labels import SANDBOX_LABEL
from sandbox._gen.containerd.api.services.containers.v1 import containers_pb2
from sandbox.client import SPEC_TYPE_URL, Containerd

RECORDS = 80
SPEC_BYTES = 256 * 1024  # 80 x 256 KiB = 20 MiB of records, over the 16 MiB limit


async def test_sandboxes_are_listed_past_the_message_limit(ctd: Containerd) -> None:
    conn, md = ctd.connection, ctd.connection.md()
    tag = uuid.uuid4().hex[:8]
    ids = [f"t-list-{tag}-{i}" for i in range(RECORDS)]
    padding = {"annotations": {"corral.test.padding": "x" * SPEC_BYTES}}
    spec = any_pb2.Any(type_url=SPEC_TYPE_URL, value=json.dumps(padding).encode())
    try:
        for sandbox_id in ids:  # records only: no snapshot, no task
            await conn.containers.Create(
                containers_pb2.CreateContainerRequest(
                    container=containers_pb2.Container(
                        id=sandbox_id,
                        labels={SANDBOX_LABEL: "1", "corral.test.list": tag},
                        image="busybox",
                        runtime=containers_pb2.Container.Runtime(name="io.containerd.runc.v2"),
                        spec=spec,
                    )
                ),
                metadata=md,
            )
        listed = await ctd.list_sandboxes({"corral.test.list": tag})
        assert sorted(info.id for info in listed) == sorted(ids)
        assert set(ids) <= set(await ctd.container_ids())
    finally:
        for sandbox_id in ids:
            await ctd.destroy_sandbox(sandbox_id)
