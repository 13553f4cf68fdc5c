"""OpenTelemetry tracing for every Corral process.

One `TracerProvider` per process (OpenTelemetry's global can be set only once),
whose export target can be switched by calling `setup_tracing` again: tests and
`corral up` re-point it at another file without losing tracers already handed
out (the Temporal interceptor keeps the tracer it was built with).
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, TypeVar, cast

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from temporalio.contrib.opentelemetry import TracingInterceptor

if TYPE_CHECKING:
    # polars is imported only by the readers: the sandbox and activity layers
    # import this module for `span` and should not pay for (or, inside
    # Temporal's workflow sandbox, trip over) loading polars.
    import polars as pl

__all__ = [
    "ATTR_EPISODE_ID",
    "ATTR_IMAGE",
    "ATTR_NODE",
    "ATTR_SANDBOX_ID",
    "ATTR_WORKFLOW_ID",
    "SPAN_COLUMNS",
    "JsonLinesSpanExporter",
    "TracingSetupError",
    "default_trace_path",
    "flush_tracing",
    "read_spans",
    "setup_tracing",
    "span",
    "span_schema",
    "temporal_tracing_interceptor",
    "trace_tree",
    "tracer",
]

log = logging.getLogger(__name__)

# Standard attribute names, shared by the sandbox, activity and worker layers so
# a trace can be filtered by sandbox, node or episode whichever layer made it.
ATTR_SANDBOX_ID = "corral.sandbox_id"
ATTR_IMAGE = "corral.image"
ATTR_NODE = "corral.node"
ATTR_EPISODE_ID = "corral.episode_id"
ATTR_WORKFLOW_ID = "corral.workflow_id"

EXPORTERS = ("file", "otlp", "none")

# Columns of `read_spans`; `attributes` is a JSON object as a string because
# its keys differ from span to span.
SPAN_COLUMNS: dict[str, str] = {
    "trace_id": "String",
    "span_id": "String",
    "parent_id": "String",
    "name": "String",
    "kind": "String",
    "start_ns": "Int64",
    "end_ns": "Int64",
    "duration_ms": "Float64",
    "status": "String",
    "status_description": "String",
    "service_name": "String",
    "attributes": "String",
}


def span_schema() -> dict[str, pl.DataType]:
    import polars as pl

    return {name: getattr(pl, dtype)() for name, dtype in SPAN_COLUMNS.items()}


class TracingSetupError(RuntimeError):
    """Tracing cannot be set up as asked (bad exporter, missing package)."""


# --------------------------------------------------------------------------- #
# File exporter
# --------------------------------------------------------------------------- #


def _hex_id(value: int, width: int) -> str:
    return format(value, f"0{width}x")


def span_to_dict(s: ReadableSpan) -> dict[str, Any]:
    """One span as the JSON object the file exporter writes."""
    ctx = s.context
    parent = s.parent
    return {
        "trace_id": _hex_id(ctx.trace_id, 32) if ctx else None,
        "span_id": _hex_id(ctx.span_id, 16) if ctx else None,
        "parent_id": _hex_id(parent.span_id, 16) if parent else None,
        "name": s.name,
        "kind": s.kind.name,
        "start_ns": s.start_time,
        "end_ns": s.end_time,
        "status": s.status.status_code.name,
        "status_description": s.status.description,
        "attributes": dict(s.attributes or {}),
        "service_name": (s.resource.attributes.get(SERVICE_NAME) if s.resource else None),
    }


class JsonLinesSpanExporter(SpanExporter):
    """Appends each finished span as one JSON object per line.

    The file stays open in append mode and is flushed per batch, so a reader
    (tests, `corral report`) sees whole lines only once the batch is exported.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._file: IO[str] | None = self.path.open("a", encoding="utf-8")

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(span_to_dict(s), default=str) + "\n" for s in spans)
        with self._lock:
            if self._file is None:
                return SpanExportResult.FAILURE
            self._file.write(lines)
            self._file.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


# --------------------------------------------------------------------------- #
# Set-up
# --------------------------------------------------------------------------- #


class _SwitchableProcessor(SpanProcessor):
    """Forwards to the current export processor; `None` drops spans.

    This is what lets `setup_tracing` be called again with another exporter
    while the global provider (settable once) stays the same object.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inner: SpanProcessor | None = None

    def swap(self, inner: SpanProcessor | None) -> None:
        with self._lock:
            old, self._inner = self._inner, inner
        if old is not None:
            old.shutdown()  # flushes what the old exporter still holds

    def on_start(self, span: Any, parent_context: otel_context.Context | None = None) -> None:
        inner = self._inner
        if inner is not None:
            inner.on_start(span, parent_context=parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        inner = self._inner
        if inner is not None:
            inner.on_end(span)

    def shutdown(self) -> None:
        self.swap(None)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        inner = self._inner
        return inner.force_flush(timeout_millis) if inner is not None else True


@dataclass(frozen=True)
class _Config:
    service_name: str
    exporter: str
    path: Path | None
    otlp_endpoint: str | None


_state_lock = threading.Lock()
_provider: TracerProvider | None = None
_switch: _SwitchableProcessor | None = None
_config: _Config | None = None


def default_trace_path(service_name: str) -> Path:
    return Path(".state") / "traces" / f"{service_name}.jsonl"


def _otlp_exporter(endpoint: str | None) -> SpanExporter:
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        raise TracingSetupError(
            "exporter 'otlp' needs the package opentelemetry-exporter-otlp "
            "(pip install opentelemetry-exporter-otlp)"
        ) from exc
    return cast(
        SpanExporter, OTLPSpanExporter(endpoint=endpoint) if endpoint else OTLPSpanExporter()
    )


def _export_processor(config: _Config) -> SpanProcessor | None:
    if config.exporter == "none":
        return None
    if config.exporter == "file":
        path = config.path or default_trace_path(config.service_name)
        return BatchSpanProcessor(JsonLinesSpanExporter(path))
    return BatchSpanProcessor(_otlp_exporter(config.otlp_endpoint))


def _install_provider(service_name: str) -> tuple[TracerProvider, _SwitchableProcessor]:
    switch = _SwitchableProcessor()
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service_name}))
    provider.add_span_processor(switch)
    trace.set_tracer_provider(provider)
    if trace.get_tracer_provider() is not provider:
        # Someone else set the global first; our spans still go to our file,
        # but spans made through the global API will not.
        log.warning("a global TracerProvider was already set; Corral's is not global")
    return provider, switch


def setup_tracing(
    service_name: str,
    *,
    exporter: str = "file",
    path: Path | None = None,
    otlp_endpoint: str | None = None,
) -> TracerProvider:
    """Set up this process's tracing and return its provider.

    `exporter`: "file" (JSON lines at `path`, default `.state/traces/<service>.jsonl`),
    "otlp" (needs opentelemetry-exporter-otlp) or "none" (spans are dropped).
    Calling again with the same arguments is a no-op; with other arguments the
    export target is switched. The service name is fixed by the first call.
    """
    global _provider, _switch, _config
    if exporter not in EXPORTERS:
        raise TracingSetupError(f"unknown trace exporter {exporter!r}; use one of {EXPORTERS}")
    config = _Config(service_name, exporter, Path(path) if path else None, otlp_endpoint)
    with _state_lock:
        if _provider is not None and config == _config:
            return _provider
        processor = _export_processor(config)  # may raise before any state changes
        if _provider is None or _switch is None:
            _provider, _switch = _install_provider(service_name)
        elif _config is not None and _config.service_name != service_name:
            log.warning(
                "tracing already set up as service %r; keeping that name, not %r",
                _config.service_name,
                service_name,
            )
        _switch.swap(processor)
        _config = config
        return _provider


def flush_tracing(timeout_millis: int = 30000) -> bool:
    """Export every finished span now (tests, and before a process exits)."""
    return _provider.force_flush(timeout_millis) if _provider is not None else True


def tracer(name: str) -> trace.Tracer:
    """A tracer from Corral's provider (a no-op proxy until `setup_tracing`)."""
    provider = _provider
    return provider.get_tracer(name) if provider is not None else trace.get_tracer(name)


def temporal_tracing_interceptor() -> TracingInterceptor:
    """Temporal's tracing interceptor, for client and workers alike.

    Put it on `Client.connect(interceptors=[...])` and every worker built on that
    client inherits it, so client, workflow worker and node worker share traces.
    """
    return TracingInterceptor(tracer("temporalio"))


# --------------------------------------------------------------------------- #
# span(): context manager and decorator
# --------------------------------------------------------------------------- #

F = TypeVar("F", bound=Callable[..., Any])


def _clean(attributes: Mapping[str, Any]) -> dict[str, Any]:
    # OpenTelemetry rejects None and arbitrary objects; callers pass optional
    # values (node may be unknown yet), so drop None and stringify the rest.
    out: dict[str, Any] = {}
    for key, value in attributes.items():
        if value is None:
            continue
        out[key] = value if isinstance(value, str | bool | int | float) else str(value)
    return out


class span:  # lower case: used like a function, `with span(...)` and `@span(...)`
    """A span around a block or a function, sync or async.

    `with span("sandbox.create", **{ATTR_SANDBOX_ID: sid}):` or
    `async with span(...)`, or as a decorator `@span("containerd.exec")` on a
    coroutine function (the span covers the awaited call, not just its creation).
    Exceptions are recorded on the span and set its status to ERROR.
    """

    def __init__(self, name: str, /, **attributes: Any) -> None:
        self.name = name
        self.attributes = _clean(attributes)
        self._cm: Any = None

    def __enter__(self) -> trace.Span:
        self._cm = tracer("corral").start_as_current_span(self.name, attributes=self.attributes)
        return cast(trace.Span, self._cm.__enter__())

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        cm, self._cm = self._cm, None
        cm.__exit__(exc_type, exc, tb)

    async def __aenter__(self) -> trace.Span:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)

    def __call__(self, fn: F) -> F:
        name, attributes = self.name, self.attributes
        # A fresh span object per call: one decorated function may run
        # concurrently in many tasks.
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                with span(name, **attributes):
                    return await fn(*args, **kwargs)

            return cast(F, async_wrapper)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with span(name, **attributes):
                return fn(*args, **kwargs)

        return cast(F, wrapper)


# --------------------------------------------------------------------------- #
# Reading spans back
# --------------------------------------------------------------------------- #


def _row(obj: dict[str, Any]) -> dict[str, Any]:
    start, end = obj.get("start_ns"), obj.get("end_ns")
    duration = (end - start) / 1e6 if start is not None and end is not None else None
    row = {key: obj.get(key) for key in SPAN_COLUMNS}
    row["duration_ms"] = duration
    row["attributes"] = json.dumps(obj.get("attributes") or {}, sort_keys=True)
    return row


def read_spans(path: Path) -> pl.DataFrame:
    """Spans written by the file exporter, one row per span (see SPAN_COLUMNS).

    `attributes` is a JSON string because keys differ from span to span. A
    missing file gives an empty frame; a torn last line (writer killed
    mid-write) is skipped.
    """
    rows: list[dict[str, Any]] = []
    p = Path(path)
    if p.exists():
        for line in p.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            try:
                rows.append(_row(json.loads(line)))
            except json.JSONDecodeError:
                log.warning("skipping unreadable span line in %s", p)
    import polars as pl

    return pl.DataFrame(rows, schema=span_schema())


def _tree_label(row: dict[str, Any]) -> str:
    attrs = json.loads(row["attributes"] or "{}")
    corral = {k: v for k, v in attrs.items() if k.startswith("corral.")}
    extra = " " + " ".join(f"{k}={v}" for k, v in sorted(corral.items())) if corral else ""
    status = "" if row["status"] in (None, "UNSET", "OK") else f" [{row['status']}]"
    duration = row["duration_ms"]
    took = f" ({duration:.1f} ms)" if duration is not None else ""
    return f"{row['name']}{took}{status}{extra}"


def trace_tree(df: pl.DataFrame, trace_id: str) -> str:
    """One trace as an indented tree, children under parents by start time.

    Spans whose parent is not in the frame (remote parent, not exported yet)
    are shown as roots, so nothing is hidden.
    """
    import polars as pl

    rows = df.filter(pl.col("trace_id") == trace_id).sort("start_ns").to_dicts()
    ids = {r["span_id"] for r in rows}
    children: dict[str | None, list[dict[str, Any]]] = {}
    for r in rows:
        parent = r["parent_id"] if r["parent_id"] in ids else None
        children.setdefault(parent, []).append(r)
    lines: list[str] = []

    def walk(parent: str | None, depth: int) -> None:
        for r in children.get(parent, []):
            lines.append("  " * depth + _tree_label(r))
            walk(r["span_id"], depth + 1)

    walk(None, 0)
    return "\n".join(lines)
