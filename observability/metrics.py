"""OpenTelemetry metrics served to Prometheus, and a scraper for `corral status`.

Each `Metrics` has its own prometheus_client registry, so two in one process
(tests, an in-process dev stack) never collide on metric names.
"""

from __future__ import annotations

import logging
import threading
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from typing import Literal, get_args
from wsgiref.simple_server import WSGIServer

from opentelemetry import metrics as otel_metrics
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.parser import text_string_to_metric_families
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

__all__ = [
    "BIND_HOST",
    "Metrics",
    "SandboxState",
    "parse_metrics",
    "scrape",
    "setup_metrics",
    "temporal_runtime_with_prometheus",
]

log = logging.getLogger(__name__)

BIND_HOST = "127.0.0.1"  # metrics are for the local operator, not the network

SandboxState = Literal["running", "idle", "paused"]
SANDBOX_STATES: tuple[str, ...] = get_args(SandboxState)

# Buckets in seconds from a warm acquire (~ms) to a slow cold provision (~min).
DURATION_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
)  # fmt: skip


class Metrics:
    """Corral's named instruments on one MeterProvider.

    Prometheus names (OpenTelemetry's translation): `corral_provision_duration_seconds`,
    `corral_exec_duration_seconds`, `corral_teardown_duration_seconds` (histograms),
    `corral_sandboxes` (gauge), `corral_alerts_total`, `corral_oom_kills_total`,
    `corral_episodes_total`, `corral_intake_alerts_total` (counters), and the
    sensor's `corral_sensor_events_total` (see `observe_counts`).
    """

    def __init__(
        self,
        service_name: str,
        provider: MeterProvider,
        registry: CollectorRegistry,
        server: WSGIServer | None = None,
    ) -> None:
        self.service_name = service_name
        self.provider = provider
        self.registry = registry
        self._server = server
        self.closed = False
        meter = provider.get_meter("corral")
        self._meter = meter
        self.provision_duration = self._duration(meter, "corral.provision.duration", "provision")
        self.exec_duration = self._duration(meter, "corral.exec.duration", "one exec")
        self.teardown_duration = self._duration(meter, "corral.teardown.duration", "teardown")
        self.sandboxes = meter.create_up_down_counter(
            "corral.sandboxes", unit="1", description="Sandboxes by node and state"
        )
        self.alerts = meter.create_counter(
            "corral.alerts", unit="1", description="Falco alerts by rule and action"
        )
        self.oom_kills = meter.create_counter(
            "corral.oom_kills", unit="1", description="Sandbox OOM kills by node"
        )
        self.episodes = meter.create_counter(
            "corral.episodes", unit="1", description="Finished episodes by outcome"
        )
        self.intake_alerts = meter.create_counter(
            "corral.intake.alerts", unit="1", description="Alerts the intake took, by outcome"
        )
        self.snapshots_collected = meter.create_counter(
            "corral.snapshot_images.collected",
            unit="1",
            description="Snapshot images removed by the node's collector, by node",
        )
        # Each sandbox's gauge state, so that removal and moves count from where it is.
        self._states: dict[tuple[str, str], SandboxState] = {}
        self._states_lock = threading.Lock()

    @staticmethod
    def _duration(meter: otel_metrics.Meter, name: str, what: str) -> otel_metrics.Histogram:
        return meter.create_histogram(
            name,
            unit="s",
            description=f"Duration of {what} in seconds",
            explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS),
        )

    @property
    def port(self) -> int | None:
        """The port /metrics is served on (the real one when 0 was asked)."""
        return int(self._server.server_port) if self._server is not None else None

    @property
    def url(self) -> str | None:
        return f"http://{BIND_HOST}:{self.port}/metrics" if self.port is not None else None

    def record_provision(self, seconds: float, node: str, image: str) -> None:
        self.provision_duration.record(seconds, {"node": node, "image": image})

    def record_exec(self, seconds: float, node: str, image: str) -> None:
        self.exec_duration.record(seconds, {"node": node, "image": image})

    def record_teardown(self, seconds: float, node: str, image: str) -> None:
        self.teardown_duration.record(seconds, {"node": node, "image": image})

    def sandbox_added(self, node: str, sandbox_id: str, state: SandboxState = "running") -> None:
        self._check_state(state)
        with self._states_lock:
            if (node, sandbox_id) in self._states:
                return  # a retried provision found its sandbox again
            self._states[(node, sandbox_id)] = state
        self.sandboxes.add(1, {"node": node, "state": state})

    def sandbox_removed(self, node: str, sandbox_id: str) -> None:
        """Counted out of the state it was in (a sandbox killed in quarantine leaves `paused`)."""
        with self._states_lock:
            state = self._states.pop((node, sandbox_id), None)
        if state is not None:  # unknown: made before this process started, never counted
            self.sandboxes.add(-1, {"node": node, "state": state})

    def sandbox_moved(self, node: str, sandbox_id: str, new: SandboxState) -> None:
        """A sandbox changed state (running -> paused on quarantine, ...); idempotent."""
        self._check_state(new)
        with self._states_lock:
            old = self._states.get((node, sandbox_id))
            if old is None or old == new:
                return
            self._states[(node, sandbox_id)] = new
        self.sandboxes.add(-1, {"node": node, "state": old})
        self.sandboxes.add(1, {"node": node, "state": new})

    @staticmethod
    def _check_state(state: str) -> None:
        if state not in SANDBOX_STATES:
            raise ValueError(f"sandbox state {state!r} is not one of {SANDBOX_STATES}")

    def record_alert(self, rule: str, action: str) -> None:
        self.alerts.add(1, {"rule": rule, "action": action})

    def record_oom_kill(self, node: str) -> None:
        self.oom_kills.add(1, {"node": node})

    def record_snapshots_collected(self, node: str, count: int) -> None:
        self.snapshots_collected.add(count, {"node": node})

    def record_episode(self, outcome: str) -> None:
        self.episodes.add(1, {"outcome": outcome})

    def record_intake_alert(self, rule: str, action: str, status: str) -> None:
        """One alert at the intake: the decided action and what delivery made of it."""
        self.intake_alerts.add(1, {"rule": rule, "action": action, "status": status})

    def observe_counts(
        self,
        name: str,
        description: str,
        read: Callable[[], Mapping[str, float]],
        attributes: Mapping[str, str],
    ) -> None:
        """Counters another component keeps (the sensor's stats), read at scrape time:
        one series per key of `read()`, labelled `kind`."""

        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(value, {**attributes, "kind": k}) for k, value in read().items()]

        self._meter.create_observable_counter(
            name, callbacks=[observe], unit="1", description=description
        )

    def exposition(self) -> str:
        """The Prometheus text page, without HTTP (tests, `--json` dumps)."""
        return generate_latest(self.registry).decode()

    def close(self) -> None:
        """Stop serving and shut the provider down; setup_metrics then makes a new one."""
        self.closed = True
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self.provider.shutdown()


_lock = threading.Lock()
_instances: dict[tuple[str, int | None], Metrics] = {}
_global_set = False


def setup_metrics(service_name: str, *, prometheus_port: int | None) -> Metrics:
    """Metrics for this process, served on http://127.0.0.1:<port>/metrics.

    `prometheus_port=None` serves nothing (read with `Metrics.exposition()`);
    0 picks a free port (see `Metrics.port`). Same arguments, same object.
    The first one becomes OpenTelemetry's global MeterProvider.
    """
    global _global_set
    key = (service_name, prometheus_port)
    with _lock:
        existing = _instances.get(key)
        if existing is not None and not existing.closed:
            return existing
        registry = CollectorRegistry()
        reader = PrometheusMetricReader(registry=registry)
        provider = MeterProvider(
            metric_readers=[reader],
            resource=Resource.create({SERVICE_NAME: service_name}),
        )
        server = None
        if prometheus_port is not None:
            server, _thread = start_http_server(prometheus_port, addr=BIND_HOST, registry=registry)
        if not _global_set:
            otel_metrics.set_meter_provider(provider)
            _global_set = True
        metrics = Metrics(service_name, provider, registry, server)
        _instances[key] = metrics
        return metrics


def temporal_runtime_with_prometheus(port: int) -> Runtime:
    """A Temporal Runtime whose SDK metrics (task latencies, polls, slots...)
    are served by the SDK core itself on http://127.0.0.1:<port>/metrics.

    Pass it as `Client.connect(..., runtime=...)`. It is a separate endpoint
    from `setup_metrics` because the core's exporter is native code.
    """
    config = PrometheusConfig(bind_address=f"{BIND_HOST}:{port}")
    return Runtime(telemetry=TelemetryConfig(metrics=config))


def parse_metrics(text: str) -> dict[str, float]:
    """Sum the samples of a Prometheus text page by sample name.

    Labels are summed away (`corral_sandboxes` is all sandboxes on all nodes);
    histogram `_bucket` samples are skipped because summing cumulative buckets
    means nothing; `_count` and `_sum` are kept.
    """
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.endswith("_bucket"):
                totals[sample.name] = totals.get(sample.name, 0.0) + float(sample.value)
    return totals


def scrape(url: str, *, timeout: float = 5.0) -> dict[str, float]:
    """Fetch a /metrics page and sum its samples by name (see parse_metrics)."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return parse_metrics(response.read().decode())
