"""Each containerd RPC as an OpenTelemetry span (`containerd/Tasks/Create`, ...),
and each call through the exec agent as one (`agent/run`).

A gRPC client interceptor on the containerd channel: it sees every call the
sandbox layer makes, so no call site needs instrumenting. It uses only the
OpenTelemetry API, which is a no-op until a process sets up a provider
(`observability.tracing.setup_tracing`), so this layer still imports nothing
of Corral's above it. Spans nest under whatever span is current: inside a
node activity, that is Temporal's `RunActivity` span of the episode.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import grpc
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

_tracer = trace.get_tracer("corral.sandbox")


def span_name(method: str | bytes) -> str:
    """`/containerd.services.tasks.v1.Tasks/Create` -> `containerd/Tasks/Create`."""
    text = method.decode() if isinstance(method, bytes) else method
    service, _, rpc = text.strip("/").partition("/")
    return f"containerd/{service.rsplit('.', 1)[-1]}/{rpc}"


def _namespace(details: grpc.aio.ClientCallDetails) -> str | None:
    for key, value in details.metadata or ():
        if key == "containerd-namespace":
            return str(value)
    return None


class _Traced:
    async def _traced(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        with _tracer.start_as_current_span(
            span_name(details.method), kind=trace.SpanKind.CLIENT
        ) as current:
            current.set_attribute("rpc.system", "grpc")
            namespace = _namespace(details)
            if namespace:
                current.set_attribute("containerd.namespace", namespace)
            call = await continuation(details, request)
            try:
                if isinstance(call, grpc.aio.UnaryUnaryCall):
                    await call  # the span covers the whole unary call
            except grpc.aio.AioRpcError as err:
                current.set_attribute("rpc.grpc.status_code", err.code().value[0])
                # NOT_FOUND answers the layer's own idempotency probes: not a failure.
                if err.code() != grpc.StatusCode.NOT_FOUND:
                    current.set_status(Status(StatusCode.ERROR, err.code().name))
            return call


class UnaryTracing(_Traced, grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await self._traced(continuation, details, request)


class StreamTracing(_Traced, grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    """Streams (events) get a span for their start only: they may last for days."""

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await self._traced(continuation, details, request)


def interceptors() -> list[grpc.aio.ClientInterceptor]:
    return [UnaryTracing(), StreamTracing()]


@contextmanager
def agent_span(op: str, sandbox_id: str) -> Iterator[trace.Span]:
    """A call through the exec agent (docs/agent.md): no containerd RPC carries it,
    so without this span a traced step would show nothing below its activity."""
    with _tracer.start_as_current_span(f"agent/{op}", kind=trace.SpanKind.CLIENT) as current:
        current.set_attribute("corral.sandbox_id", sandbox_id)
        yield current
