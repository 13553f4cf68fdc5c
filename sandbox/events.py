"""containerd task events as SandboxEvents, re-subscribing across containerd restarts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc

from sandbox._gen.containerd.api.events import task_pb2 as task_events_pb2
from sandbox._gen.containerd.api.services.events.v1 import events_pb2
from sandbox.connection import Connection
from sandbox.models import SandboxEvent

DEFAULT_TOPICS = ("/tasks/oom", "/tasks/exit")
RESUBSCRIBE_MIN_S = 0.1
RESUBSCRIBE_MAX_S = 5.0

_PAYLOADS: dict[str, Any] = {
    "/tasks/oom": task_events_pb2.TaskOOM,
    "/tasks/exit": task_events_pb2.TaskExit,
    "/tasks/create": task_events_pb2.TaskCreate,
    "/tasks/start": task_events_pb2.TaskStart,
    "/tasks/delete": task_events_pb2.TaskDelete,
    "/tasks/paused": task_events_pb2.TaskPaused,
    "/tasks/resumed": task_events_pb2.TaskResumed,
    "/tasks/exec-added": task_events_pb2.TaskExecAdded,
    "/tasks/exec-started": task_events_pb2.TaskExecStarted,
}


def event_filters(namespace: str, topics: Sequence[str]) -> list[str]:
    # separate filters are ORed, the comma inside one filter ANDs
    return [f'namespace=="{namespace}",topic=="{topic}"' for topic in topics]


def decode_envelope(envelope: Any) -> SandboxEvent:
    payload_type = _PAYLOADS.get(envelope.topic)
    payload = payload_type() if payload_type is not None else None
    if payload is not None:
        payload.ParseFromString(envelope.event.value)
    container_id = getattr(payload, "container_id", "")
    process_id = getattr(payload, "id", "") or getattr(payload, "exec_id", "")
    return SandboxEvent(
        topic=envelope.topic,
        sandbox_id=container_id,
        namespace=envelope.namespace,
        timestamp=envelope.timestamp.ToDatetime() if envelope.HasField("timestamp") else None,
        exec_id=process_id if process_id and process_id != container_id else None,
        pid=getattr(payload, "pid", None) or None,
        exit_status=getattr(payload, "exit_status", None)
        if envelope.topic == "/tasks/exit"
        else None,
    )


async def subscribe_events(conn: Connection, topics: Sequence[str]) -> AsyncIterator[SandboxEvent]:
    """Yield events forever; a broken stream (containerd restart) is re-opened with backoff."""
    request = events_pb2.SubscribeRequest(filters=event_filters(conn.namespace, topics))
    backoff = RESUBSCRIBE_MIN_S
    while True:
        call = conn.events.Subscribe(request)
        try:
            async for envelope in call:
                backoff = RESUBSCRIBE_MIN_S
                yield decode_envelope(envelope)
        except grpc.aio.AioRpcError as err:
            if err.code() not in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.UNKNOWN,
                grpc.StatusCode.INTERNAL,
            ):
                raise
        finally:
            call.cancel()
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, RESUBSCRIBE_MAX_S)
