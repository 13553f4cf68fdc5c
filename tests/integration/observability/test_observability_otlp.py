"""The OTLP trace exporter, against an OTLP/gRPC receiver started here.

A trainer's process configured with `CORRAL_TRACES=otlp` starts a real episode
on the session stack; the receiver must get its spans, with the service name
and the episode's workflow id, over gRPC as a collector (Jaeger, Tempo,
the OpenTelemetry Collector) would.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import AsyncIterator

import grpc
import pytest
import pytest_asyncio
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from tests.integration.conftest import REPO
from workers.stack import Stack

pytestmark = pytest.mark.integration

CLIENT = """
import asyncio, os, sys
from corral import Corral

async def main() -> None:
    async with await Corral.connect() as corral:  # leaving flushes the spans
        spec = {"image": "busybox", "steps": ["echo otlp"]}
        await corral.run_episode(spec, episode_id=sys.argv[1])

asyncio.run(main())
os._exit(0)  # temporalio/sdk-python#300
"""


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """Keeps every span it is sent: (service name, span name, attributes)."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, str, dict[str, str]]] = []

    async def Export(  # the gRPC method's name
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: object
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        for resource_spans in request.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    attrs = {a.key: a.value.string_value for a in span.attributes}
                    self.spans.append((resource.get("service.name", ""), span.name, attrs))
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest_asyncio.fixture
async def receiver() -> AsyncIterator[tuple[Receiver, str]]:
    server = grpc.aio.server()
    servicer = Receiver()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield servicer, f"http://127.0.0.1:{port}"
    finally:
        await server.stop(grace=None)


async def test_a_client_exports_its_episode_spans_over_otlp(
    stack: Stack, receiver: tuple[Receiver, str]
) -> None:
    servicer, endpoint = receiver
    episode_id = f"otlp-{uuid.uuid4().hex[:10]}"
    env = {**os.environ, "CORRAL_TRACES": "otlp", "CORRAL_OTLP_ENDPOINT": endpoint}
    client = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CLIENT, episode_id, env=env, cwd=REPO,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, stderr = await asyncio.wait_for(client.communicate(), 300)
    assert client.returncode == 0, stderr.decode()[-2000:]
    started = [
        (service, name)
        for service, name, attrs in servicer.spans
        if attrs.get("temporalWorkflowID") == episode_id
    ]
    assert ("corral-client", "StartWorkflow:EpisodeWorkflow") in started, servicer.spans[:5]
