"""The per-node sensor process: ``python -m workers.sensor --node NODE``.

The tracer (``policies.sensor.Sensor``: the compiled libbpf program, or
bpftrace, as ``sensor.backend`` says) streams the syscalls the loaded Falco
rules need from sandbox cgroups; Corral's rule engine evaluates them; each
match becomes Falco's alert JSON and is POSTed to the alert intake, exactly
as production Falco's ``http_output`` would post it.

Pipeline (all on one event loop, nothing in it waits on HTTP):

    tracer -> Sensor callback -> node filter -> RuleEngine.evaluate
             -> rate limit (rule, container) -> bounded queue -> HTTP posters

Node filter: every containerd daemon on a machine puts its sandboxes under
the same ``/corral`` cgroup parent, so on a machine running several local
nodes each sensor sees every node's sandboxes. A sensor only reports the
sandboxes its own node's containerd knows (labels come from there too); an
event from a container it has not seen yet is held while the node's
container list is refreshed, then evaluated or dropped.

Delivery: a bounded queue (oldest dropped when full, counted) and a few
posters with bounded retries on connection errors and 5xx; 4xx answers are
final (401 wrong token, 400 malformed, 404 the intake does not know the
sandbox). Alert latency, from the syscall's kernel timestamp to the intake's
answer, is recorded and logged with the counters every ``STATS_EVERY_S``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import socket
import ssl
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from observability.metrics import Metrics, setup_metrics
from policies.alert import KEPT_FIELDS, Alert
from policies.falco.engine import Match, RuleEngine
from policies.falco.event import ContainerInfo, Event, MountInfo, mounts_from_spec
from policies.falco.fields import default_registry
from sandbox.errors import CorralError
from workers.config import StackConfig, load_config
from workers.directory import WORKFLOW_ID_FIELD

log = logging.getLogger("corral.sensor.node")

STATS_EVERY_S = 30.0
REFRESH_EVERY_S = 5.0


# --------------------------------------------------------------------- alerts


def alert_body(match: Match, evt: Event, hostname: str) -> dict[str, Any]:
    """Falco's json_output body for one match, with the fields Corral relies on."""
    body = match.falco_json(evt.wall_ns or time.time_ns(), hostname)
    body["uuid"] = str(uuid.uuid4())
    fields = body["output_fields"]
    if evt.container is not None:
        fields["container.id"] = evt.container.id
        fields["container.full_id"] = evt.container.full_id
        # The intake finds the episode from this; it has no node's containerd.
        owner = (evt.container.labels or {}).get("corral.workflow_id")
        if owner:
            fields[WORKFLOW_ID_FIELD] = owner
    fields.setdefault("proc.cmdline", evt.proc.cmdline)
    if not isinstance(fields.get("proc.pid"), int):
        fields["proc.pid"] = evt.proc.pid
    for name in KEPT_FIELDS:
        fields.setdefault(name, None)
    return body


class RateLimiter:
    """At most one alert per (rule, container) per ``window_s``; counts the rest."""

    def __init__(self, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self._clock = clock
        self._last: dict[tuple[str, str], float] = {}
        self.suppressed = 0

    def allow(self, rule: str, container: str) -> bool:
        now = self._clock()
        key = (rule, container)
        last = self._last.get(key)
        if last is not None and now - last < self.window_s:
            self.suppressed += 1
            return False
        self._last[key] = now
        if len(self._last) > 10_000:  # forget stale keys
            cutoff = now - self.window_s
            self._last = {k: v for k, v in self._last.items() if v >= cutoff}
        return True


@dataclass
class PosterStats:
    queued: int = 0
    posted: int = 0  # the intake answered 2xx
    rejected: int = 0  # 4xx: final
    failed: int = 0  # retries exhausted
    retries: int = 0
    dropped: int = 0  # queue full
    latencies_ms: deque[float] = field(default_factory=lambda: deque(maxlen=2048))
    last_status: dict[str, Any] = field(default_factory=dict)

    def percentiles(self) -> dict[str, float]:
        data = sorted(self.latencies_ms)
        if not data:
            return {}

        def pct(p: float) -> float:
            return data[min(len(data) - 1, int(p * len(data)))]

        return {"p50_ms": pct(0.5), "p99_ms": pct(0.99), "max_ms": data[-1], "n": len(data)}


class AlertPoster:
    """Bounded queue + posters: POST alert bodies to the intake, never blocking the caller."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        queue_size: int = 1000,
        workers: int = 4,
        attempts: int = 5,
        backoff_s: tuple[float, float] = (0.1, 2.0),
        timeout_s: float = 10.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.url = url
        self._ssl = ssl_context  # https: verify the intake against the configured CA
        self._headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self._queue: deque[tuple[dict[str, Any], int]] = deque()
        self._queue_size = queue_size
        self._wake = asyncio.Event()
        self._n_workers = workers
        self._attempts = attempts
        self._backoff = backoff_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None
        self._inflight = 0
        self.stats = PosterStats()

    def submit(self, body: dict[str, Any], event_ts_ns: int) -> None:
        """Queue one alert (``event_ts_ns``: CLOCK_MONOTONIC of the syscall)."""
        if len(self._queue) >= self._queue_size:
            self._queue.popleft()
            self.stats.dropped += 1
        self._queue.append((body, event_ts_ns))
        self.stats.queued += 1
        self._wake.set()

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=self._timeout)
        self._tasks = [
            asyncio.create_task(self._worker(), name=f"alert-poster-{i}")
            for i in range(self._n_workers)
        ]

    async def drain(self, timeout_s: float = 5.0) -> None:
        """Wait (bounded) until queued alerts are sent."""
        deadline = time.monotonic() + timeout_s
        while (self._queue or self._inflight) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _worker(self) -> None:
        while True:
            while not self._queue:
                self._wake.clear()
                await self._wake.wait()
            body, ts = self._queue.popleft()
            self._inflight += 1
            try:
                await self._post(body, ts)
            finally:
                self._inflight -= 1

    async def _post(self, body: dict[str, Any], event_ts_ns: int) -> None:
        assert self._session is not None
        data = json.dumps(body).encode()
        delay = self._backoff[0]
        rule, cid = body.get("rule"), body["output_fields"].get("container.id")
        for attempt in range(1, self._attempts + 1):
            try:
                async with self._session.post(
                    self.url, data=data, headers=self._headers, ssl=self._ssl or True
                ) as resp:
                    status = resp.status
                    text = await resp.text()
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                status, text = 0, f"{type(exc).__name__}: {exc}"
            if 200 <= status < 300:
                self.stats.posted += 1
                latency = (time.monotonic_ns() - event_ts_ns) / 1e6 if event_ts_ns else None
                if latency is not None:
                    self.stats.latencies_ms.append(latency)
                with contextlib.suppress(ValueError):
                    self.stats.last_status = json.loads(text)
                log.info("alert rule=%r container=%s -> %s latency_ms=%s answer=%s output=%s",
                         rule, cid, status, f"{latency:.1f}" if latency is not None else "?",
                         text[:200], str(body.get("output", ""))[:500])  # fmt: skip
                return
            if 400 <= status < 500:
                self.stats.rejected += 1
                log.warning("alert rule=%r container=%s rejected by intake: %s %s",
                            rule, cid, status, text[:200])  # fmt: skip
                return
            if attempt < self._attempts:
                self.stats.retries += 1
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._backoff[1])
        self.stats.failed += 1
        log.error("alert rule=%r container=%s not delivered after %d attempts: %s %s",
                  rule, cid, self._attempts, status, text[:200])  # fmt: skip


# ------------------------------------------------------------------ the node


class NodeContainers:
    """The node's sandboxes from its containerd: a sync ``ContainerResolver``
    over a cache that ``refresh`` fills asynchronously."""

    def __init__(self, socket_path: str, namespace: str) -> None:
        self._socket = socket_path
        self._namespace = namespace
        self._client: Any = None
        self.known: dict[str, ContainerInfo] = {}

    def __call__(self, full_id: str) -> ContainerInfo | None:
        return self.known.get(full_id)

    async def refresh(self) -> set[str]:
        """Re-list the node's sandboxes; returns the ids that went away."""
        from sandbox import Containerd

        if self._client is None:
            self._client = await Containerd.connect(self._socket, namespace=self._namespace)
        infos = await self._client.list_sandboxes()
        seen: dict[str, ContainerInfo] = {}
        for info in infos:
            labels = dict(info.labels)
            old = self.known.get(info.id)
            ci = old or ContainerInfo(full_id=info.id, mounts=await self._mounts(info.id))
            ci.name = labels.get("corral.workflow_id", info.id[:12])
            ci.image = info.image
            ci.labels = labels
            if info.created_at is not None and ci.start_ts is None:
                ci.start_ts = int(info.created_at.timestamp() * 1e9)
            seen[info.id] = ci
        gone = set(self.known) - set(seen)
        self.known = seen
        return gone

    async def _mounts(self, sandbox_id: str) -> list[MountInfo]:
        """The mounts of the sandbox's OCI spec (Falco's container.mount* fields)."""
        from sandbox._gen.containerd.api.services.containers.v1 import containers_pb2

        conn = self._client.connection
        try:
            resp = await conn.containers.Get(
                containers_pb2.GetContainerRequest(id=sandbox_id), metadata=conn.md()
            )
            spec = json.loads(resp.container.spec.value or b"{}")
        except Exception as err:  # gone since the listing, or a spec we cannot read
            log.debug("no mounts for %s: %s", sandbox_id[:12], err)
            return []
        return mounts_from_spec(spec.get("mounts") or [])

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None


@dataclass
class PipelineStats:
    events: int = 0
    evaluated: int = 0
    foreign: int = 0  # events of another node's sandboxes
    held: int = 0
    held_dropped: int = 0
    matches: int = 0


class NodePipeline:
    """Sensor events -> node filter -> engine -> rate limit -> poster."""

    MAX_HELD = 256  # events held per not-yet-known container

    def __init__(
        self,
        engine: RuleEngine,
        containers: NodeContainers,
        poster: AlertPoster,
        *,
        hostname: str,
        dedup_window_s: float = 5.0,
        on_forget: Callable[[str], None] | None = None,
    ) -> None:
        self.engine = engine
        self.containers = containers
        self.poster = poster
        self.hostname = hostname
        self.limiter = RateLimiter(dedup_window_s)
        self.stats = PipelineStats()
        self._held: dict[str, list[Event]] = {}
        self._foreign: dict[str, float] = {}  # full id -> until (monotonic)
        self._refreshing: asyncio.Task[None] | None = None
        self._on_forget = on_forget

    def on_event(self, evt: Event) -> None:
        self.stats.events += 1
        container = evt.container
        if container is None:
            return
        full_id = container.full_id
        if full_id in self.containers.known:
            self._evaluate(evt)
            return
        until = self._foreign.get(full_id)
        if until is not None and until > time.monotonic():
            self.stats.foreign += 1
            return
        held = self._held.setdefault(full_id, [])
        if len(held) < self.MAX_HELD:
            held.append(evt)
            self.stats.held += 1
        else:
            self.stats.held_dropped += 1
        self.kick_refresh()

    def kick_refresh(self) -> None:
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.create_task(self._refresh())

    async def _refresh(self) -> None:
        try:
            gone = await self.containers.refresh()
        except (CorralError, OSError) as exc:
            log.warning("cannot list the node's sandboxes: %s", exc)
            await asyncio.sleep(0.5)
            gone = set()
        for full_id in gone:
            if self._on_forget is not None:
                self._on_forget(full_id)
        held, self._held = self._held, {}
        now = time.monotonic()
        for full_id, events in held.items():
            info = self.containers.known.get(full_id)
            if info is None:
                self._foreign[full_id] = now + 30.0
                self.stats.foreign += len(events)
                continue
            for evt in events:
                self._fill(evt, info)
                self._evaluate(evt)
        if len(self._foreign) > 10_000:
            self._foreign = {k: v for k, v in self._foreign.items() if v > now}

    @staticmethod
    def _fill(evt: Event, info: ContainerInfo) -> None:
        """Events seen before the labels were known share a bare ContainerInfo."""
        c = evt.container
        if c is not None and c is not info:
            c.name, c.image, c.labels = info.name, info.image, info.labels
            c.start_ts = c.start_ts or info.start_ts

    def _evaluate(self, evt: Event) -> None:
        self.stats.evaluated += 1
        for match in self.engine.evaluate(evt):
            self.stats.matches += 1
            assert evt.container is not None
            if not self.limiter.allow(match.rule, evt.container.full_id):
                continue
            body = alert_body(match, evt, self.hostname)
            try:
                Alert.model_validate(body)
            except ValueError as exc:  # pydantic's ValidationError
                log.error("rule %r produced an invalid alert: %s", match.rule, exc)
                continue
            self.poster.submit(body, evt.ts_ns)


# ------------------------------------------------------------------- process


def build_engine(config: StackConfig) -> RuleEngine:
    paths = [config.resolve(p) for p in config.sensor.rules]
    return RuleEngine.from_files(paths, default_registry(), strict=True, rule_matching="first")


def intake_url(config: StackConfig) -> str:
    return config.intake_url


def intake_ssl(config: StackConfig) -> ssl.SSLContext | None:
    from workers.tls import client_context

    if not config.intake_url.startswith("https:"):
        return None
    ca = config.intake.tls_ca
    return client_context(config.resolve(ca) if ca else None)


async def run_node_sensor(
    config: StackConfig, node: str, *, stop: asyncio.Event | None = None
) -> None:
    from policies.sensor.prefilter import sensor_for
    from workers.intake import load_token

    if node not in config.node_names():
        raise SystemExit(f"unknown node {node!r} (one of {', '.join(config.node_names())})")
    engine = build_engine(config)
    types = engine.event_types()
    unbounded = engine.ruleset.unbounded_rules()
    if unbounded:
        log.warning("rules without an evt.type restriction see only traced syscalls: %s",
                    ", ".join(unbounded))  # fmt: skip
    token = load_token(config.intake.token_env, config.intake_token_file).get_secret_value()
    containers = NodeContainers(
        str(config.containerd_socket(node)), config.nodes.containerd_namespace
    )
    poster = AlertPoster(intake_url(config), token, ssl_context=intake_ssl(config))
    sensor = sensor_for(engine, containers, config.sensor.backend)
    pipeline = NodePipeline(
        engine, containers, poster,
        hostname=f"{socket.gethostname()}/{node}", on_forget=sensor.forget,
    )  # fmt: skip
    sensor.add_callback(pipeline.on_event)
    metrics = _served_metrics(config, node, sensor, pipeline, poster)
    stop = stop or asyncio.Event()
    await poster.start()
    with contextlib.suppress(CorralError, OSError):
        await containers.refresh()
    await sensor.start()
    log.info("sensor for %s: %d rules, event types %s, intake %s", node,
             len(engine.ruleset.active), ",".join(sorted(types)), poster.url)  # fmt: skip
    ticker = asyncio.create_task(_housekeeping(sensor, pipeline, poster, node))
    ready = asyncio.create_task(_mark_ready(sensor, _ready_file(config, node), node))
    try:
        await stop.wait()
    finally:
        for task in (ticker, ready):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await sensor.stop()  # stops the tracer
        await poster.drain(timeout_s=3.0)
        await poster.stop()
        await containers.close()
        with contextlib.suppress(OSError):
            _ready_file(config, node).unlink()
        _log_stats(sensor, pipeline, poster, node)
        metrics.close()


def _served_metrics(
    config: StackConfig, node: str, sensor: Any, pipeline: NodePipeline, poster: AlertPoster
) -> Metrics:
    """The sensor's counters (the ones `_log_stats` logs) on its Prometheus endpoint."""
    port = config.service_metrics_port(node)
    metrics = setup_metrics(f"corral-sensor-{node}", prometheus_port=port)
    s, p, a = sensor.stats, pipeline.stats, poster.stats
    metrics.observe_counts(
        "corral.sensor.events",
        "Sensor events by stage: seen, lost, evaluated, matched, posted, failed",
        lambda: {"seen": s.events, "lost": s.lost, "dropped": s.dropped,
                 "evaluated": p.evaluated, "matched": p.matches, "posted": a.posted,
                 "rejected": a.rejected, "failed": a.failed},
        {"node": node},
    )  # fmt: skip
    return metrics


async def _mark_ready(sensor: Any, path: Path, node: str) -> None:
    await sensor.wait_ready()
    log.info("sensor for %s: %s attached", node, sensor.active_backend)
    path.write_text(str(time.time()))


def _ready_file(config: StackConfig, node: str) -> Path:
    """Written once the tracer has attached: tests and tools wait for it."""
    return config.state / "run" / f"sensor-{node}.ready"


async def _housekeeping(
    sensor: Any, pipeline: NodePipeline, poster: AlertPoster, node: str
) -> None:
    last_stats = time.monotonic()
    while True:
        await asyncio.sleep(REFRESH_EVERY_S)
        pipeline.kick_refresh()  # forget removed sandboxes
        if time.monotonic() - last_stats >= STATS_EVERY_S:
            last_stats = time.monotonic()
            _log_stats(sensor, pipeline, poster, node)


def _log_stats(sensor: Any, pipeline: NodePipeline, poster: AlertPoster, node: str) -> None:
    s, p, a = sensor.stats, pipeline.stats, poster.stats
    log.info(
        "stats %s: events=%d lost=%d dropped=%d evaluated=%d foreign=%d matches=%d "
        "suppressed=%d queued=%d posted=%d rejected=%d failed=%d retries=%d qdropped=%d "
        "latency=%s", node, s.events, s.lost, s.dropped, p.evaluated, p.foreign, p.matches,
        pipeline.limiter.suppressed, a.queued, a.posted, a.rejected, a.failed, a.retries,
        a.dropped, a.percentiles() or "-",
    )  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m workers.sensor")
    parser.add_argument("--node", required=True)
    parser.add_argument("--config", type=Path, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    config = load_config(args.config)

    async def _run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_node_sensor(config, args.node, stop=stop)

    asyncio.run(_run())


if __name__ == "__main__":
    main()
