"""The per-node sensor process: ``python -m workers.sensor --node NODE``.

The tracer (``policies.sensor.Sensor``: the compiled libbpf program, or
bpftrace, as ``sensor.backend`` says) streams the syscalls the loaded Falco
rules need from sandbox cgroups; Corral's rule engine evaluates them; each
match becomes Falco's alert JSON and is POSTed to the alert intake, exactly
as production Falco's ``http_output`` would post it.

Pipeline (all on one event loop, nothing in it waits on HTTP):

    tracer -> Sensor callback -> node filter -> RuleEngine.evaluate
             -> rate limit (rule, container) -> owner, read fresh from containerd
             -> freeze in place (kill/quarantine) -> poster (workers/sensor_delivery.py)

Node filter: every containerd daemon on a machine puts its sandboxes under
the same ``/corral`` cgroup parent, so on a machine running several local
nodes each sensor sees every node's sandboxes. A sensor only reports the
sandboxes its own node's containerd knows; an event from a container it has
not seen yet is held while that id is looked up in the node's containerd,
then evaluated, or dropped as another node's.

Delivery never drops an alert: it is delivered, enforced on the node, or
suppressed by its rule's rate limit (workers/sensor_delivery.py). The
watermark the node worker waits on after each step is served on a unix
socket (workers/sensor_service.py). Counters are logged every
``STATS_EVERY_S`` and served on Prometheus.
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract.config import StackConfig, load_config
from contract.errors import CorralError
from contract.labels import OWNER_LABEL
from observability.metrics import Metrics, setup_metrics
from policies.alert import KEPT_FIELDS, Alert
from policies.falco.engine import Match, RuleEngine
from policies.falco.event import ContainerInfo, Event, MountInfo, mounts_from_spec
from policies.falco.fields import default_registry
from workers.directory import WORKFLOW_ID_FIELD
from workers.sensor_delivery import AlertPoster, LocalEnforcer, RateLimiter

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
        owner = (evt.container.labels or {}).get(OWNER_LABEL)
        if owner:
            fields[WORKFLOW_ID_FIELD] = owner
    fields.setdefault("proc.cmdline", evt.proc.cmdline)
    if not isinstance(fields.get("proc.pid"), int):
        fields["proc.pid"] = evt.proc.pid
    for name in KEPT_FIELDS:
        fields.setdefault(name, None)
    return body


# ------------------------------------------------------------------ the node


class NodeContainers:
    """The node's sandboxes from its containerd: a sync ``ContainerResolver``
    over a cache that ``refresh`` fills asynchronously.

    The cache serves the rule engine (image, mounts). Who owns a sandbox is
    never taken from it: a warm-pool sandbox is claimed by relabelling, so
    ``owner_labels`` reads the labels from containerd when an alert is sent.
    """

    def __init__(self, socket_path: str, namespace: str) -> None:
        self._socket = socket_path
        self._namespace = namespace
        self._client: Any = None
        self.known: dict[str, ContainerInfo] = {}
        self._adopted: dict[str, float] = {}  # full id -> when a lookup found it (monotonic)

    def __call__(self, full_id: str) -> ContainerInfo | None:
        return self.known.get(full_id)

    async def client(self) -> Any:
        from sandbox import Containerd

        if self._client is None:
            self._client = await Containerd.connect(self._socket, namespace=self._namespace)
        return self._client

    async def refresh(self) -> set[str]:
        """Re-list the node's sandboxes; returns the ids that went away."""
        client = await self.client()
        listed_at = time.monotonic()
        infos = await client.list_sandboxes()
        seen: dict[str, ContainerInfo] = {}
        for info in infos:
            old = self.known.get(info.id)
            ci = old or ContainerInfo(full_id=info.id, mounts=await self._mounts(info.id))
            self._label(ci, dict(info.labels), info.image)
            if info.created_at is not None and ci.start_ts is None:
                ci.start_ts = int(info.created_at.timestamp() * 1e9)
            seen[info.id] = ci
        # A sandbox adopted while the listing ran is not in it, and not gone.
        adopted = {k for k, at in self._adopted.items() if at >= listed_at and k in self.known}
        gone = set(self.known) - set(seen) - adopted
        self.known = {**{k: self.known[k] for k in adopted}, **seen}
        self._adopted = {k: at for k, at in self._adopted.items() if k in adopted}
        return gone

    async def lookup(self, full_id: str) -> ContainerInfo | None:
        """One sandbox by id from containerd (None: not this node's), cached."""
        spec_and_labels = await self._get(full_id)
        if spec_and_labels is None:
            return None
        spec, labels, image = spec_and_labels
        ci = self.known.get(full_id)
        if ci is None:
            ci = ContainerInfo(full_id=full_id, mounts=mounts_from_spec(spec.get("mounts") or []))
            self._adopted[full_id] = time.monotonic()
            self.known[full_id] = ci
        self._label(ci, labels, image)
        return ci

    async def owner_labels(self, full_id: str) -> dict[str, str] | None:
        """The sandbox's labels as containerd has them now (None: it is gone)."""
        ci = await self.lookup(full_id)
        return None if ci is None else dict(ci.labels or {})

    async def destroy(self, full_id: str) -> None:
        await (await self.client()).destroy_sandbox(full_id)

    async def pause(self, full_id: str) -> None:
        sandbox = await (await self.client()).get_sandbox(full_id)
        if await sandbox.status() != "paused":
            await sandbox.pause()

    @staticmethod
    def _label(ci: ContainerInfo, labels: dict[str, str], image: str) -> None:
        ci.name = labels.get(OWNER_LABEL, ci.full_id[:12])
        ci.image = image
        ci.labels = labels

    async def _get(self, full_id: str) -> tuple[dict[str, Any], dict[str, str], str] | None:
        from sandbox._gen.containerd.api.services.containers.v1 import containers_pb2
        from sandbox.grpc_errors import is_not_found

        client = await self.client()
        conn = client.connection
        try:
            resp = await conn.containers.Get(
                containers_pb2.GetContainerRequest(id=full_id), metadata=conn.md()
            )
        except Exception as err:
            if is_not_found(err):
                return None
            raise
        container = resp.container
        try:
            spec = json.loads(container.spec.value or b"{}")
        except ValueError:
            spec = {}
        return spec, dict(container.labels), container.image

    async def _mounts(self, sandbox_id: str) -> list[MountInfo]:
        """The mounts of the sandbox's OCI spec (Falco's container.mount* fields)."""
        try:
            got = await self._get(sandbox_id)
        except Exception as err:  # a spec we cannot read
            log.debug("no mounts for %s: %s", sandbox_id[:12], err)
            return []
        return [] if got is None else mounts_from_spec(got[0].get("mounts") or [])

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
    unowned: int = 0  # alerts of sandboxes no episode owns (policy tests, benches, idle pool)


class NodePipeline:
    """Sensor events -> node filter -> engine -> rate limit -> owner -> poster.

    ``pending`` counts, per sandbox, the alerts not yet delivered or enforced,
    so that ``settle`` can tell a step that its alerts are in.
    """

    MAX_HELD = 4096  # events held per not-yet-known container

    def __init__(
        self,
        engine: RuleEngine,
        containers: NodeContainers,
        poster: AlertPoster,
        *,
        hostname: str,
        enforcer: LocalEnforcer | None = None,
        dedup_window_s: float = 5.0,
        on_forget: Callable[[str], None] | None = None,
    ) -> None:
        self.engine = engine
        self.containers = containers
        self.poster = poster
        self.enforcer = enforcer
        self.hostname = hostname
        self.limiter = RateLimiter(dedup_window_s)
        self.stats = PipelineStats()
        self.pending: dict[str, int] = {}
        self.actions: dict[str, set[str]] = {}  # full id -> decisions of its alerts so far
        self._settled = asyncio.Event()
        self._held: dict[str, list[Event]] = {}
        self._foreign: dict[str, float] = {}  # full id -> until (monotonic)
        self._resolving: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
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
        self._kick_resolve()

    # -------------------------------------------------------- containers
    def kick_refresh(self) -> None:
        """Re-list (housekeeping): forget removed sandboxes."""
        self._spawn(self._refresh())

    async def _refresh(self) -> None:
        try:
            gone = await self.containers.refresh()
        except (CorralError, OSError) as exc:
            log.warning("cannot list the node's sandboxes: %s", exc)
            return
        for full_id in gone:
            self.actions.pop(full_id, None)
            if self._on_forget is not None:
                self._on_forget(full_id)

    def _kick_resolve(self) -> None:
        if self._resolving is None or self._resolving.done():
            self._resolving = asyncio.create_task(self._resolve_held())

    async def _resolve_held(self) -> None:
        """Ask containerd about each held container by id: this node's, or foreign."""
        while self._held:
            full_id, events = next(iter(self._held.items()))
            try:
                info = await self.containers.lookup(full_id)
            except Exception as exc:  # containerd unreachable: try again shortly
                log.warning("cannot look up sandbox %s: %s", full_id[:12], exc)
                await asyncio.sleep(0.5)
                continue
            events = self._held.pop(full_id, events)
            if info is None:
                self._foreign[full_id] = time.monotonic() + 30.0
                self.stats.foreign += len(events)
                continue
            for evt in events:
                self._fill(evt, info)
                self._evaluate(evt)
        now = time.monotonic()
        if len(self._foreign) > 10_000:
            self._foreign = {k: v for k, v in self._foreign.items() if v > now}

    async def resolved(self, full_id: str, deadline: float) -> bool:
        """Until events held for ``full_id`` have been judged (bounded)."""
        while full_id in self._held and time.monotonic() < deadline:
            task = self._resolving
            if task is None or task.done():
                self._kick_resolve()
                task = self._resolving
            assert task is not None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), max(0.0, deadline - time.monotonic()))
        return full_id not in self._held

    @staticmethod
    def _fill(evt: Event, info: ContainerInfo) -> None:
        """Events seen before the labels were known share a bare ContainerInfo."""
        c = evt.container
        if c is not None and c is not info:
            c.name, c.image, c.labels = info.name, info.image, info.labels
            c.start_ts = c.start_ts or info.start_ts

    # ----------------------------------------------------------- alerts
    def _evaluate(self, evt: Event) -> None:
        self.stats.evaluated += 1
        for match in self.engine.evaluate(evt):
            self.stats.matches += 1
            assert evt.container is not None
            full_id = evt.container.full_id
            if not self.limiter.allow(match.rule, full_id):
                continue
            self.pending[full_id] = self.pending.get(full_id, 0) + 1
            self._settled.clear()
            self._spawn(self._send(match, evt))

    async def _send(self, match: Match, evt: Event) -> None:
        """Name the owner as containerd has it now, freeze in place if it will be
        killed or quarantined, then hand the alert to the poster."""
        assert evt.container is not None
        full_id = evt.container.full_id
        handed = False
        try:
            with contextlib.suppress(Exception):  # gone, or containerd slow: cached labels
                labels = await self.containers.owner_labels(full_id)
                if labels is not None:
                    evt.container.labels = labels
                    evt.container.name = labels.get(OWNER_LABEL, full_id[:12])
            body = alert_body(match, evt, self.hostname)
            try:
                Alert.model_validate(body)
            except ValueError as exc:  # pydantic's ValidationError
                log.error("rule %r produced an invalid alert: %s", match.rule, exc)
                return
            if WORKFLOW_ID_FIELD not in body["output_fields"]:
                self.stats.unowned += 1  # posted (real Falco's path: SandboxId), never frozen
            await self._freeze_in_place(body, evt)
            self.poster.submit(body, evt.ts_ns, lambda _outcome: self._done(full_id))
            handed = True
        finally:
            if not handed:
                self._done(full_id)

    async def _freeze_in_place(self, body: dict[str, Any], evt: Event) -> None:
        if self.enforcer is None:
            return
        decision = self.enforcer.decide(body)
        full_id = str(body["output_fields"].get("container.full_id"))
        self.actions.setdefault(full_id, set()).add(decision.action)
        owned = WORKFLOW_ID_FIELD in body["output_fields"]  # only an episode's sandbox
        if owned and decision.action in ("kill", "quarantine") and not decision.dry_run:
            await self.enforcer.freeze_now(body, decision, evt.wall_ns)

    def _done(self, full_id: str) -> None:
        left = self.pending.get(full_id, 1) - 1
        if left > 0:
            self.pending[full_id] = left
        else:
            self.pending.pop(full_id, None)
        self._settled.set()

    async def delivered(self, full_id: str, deadline: float) -> bool:
        """Until every alert of ``full_id`` so far is delivered or enforced (bounded)."""
        while self.pending.get(full_id) and time.monotonic() < deadline:
            self._settled.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._settled.wait(), deadline - time.monotonic())
        return not self.pending.get(full_id)

    def _spawn(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


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
    from policies.responses import load_responses
    from policies.sensor.prefilter import sensor_for
    from workers.intake import load_token
    from workers.sensor_service import SensorService

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
    enforcer = LocalEnforcer(
        load_responses(config.resolve(config.sensor.responses)),
        destroy=containers.destroy, pause=containers.pause,
        enforced_record=config.sensor_enforced_record(node),
        frozen_record=config.sensor_frozen_record(node),
    )  # fmt: skip
    poster = AlertPoster(
        intake_url(config), token, enforce=enforcer.enforce, ssl_context=intake_ssl(config)
    )
    sensor = sensor_for(engine, containers, config.sensor.backend)
    pipeline = NodePipeline(
        engine, containers, poster, enforcer=enforcer,
        hostname=f"{socket.gethostname()}/{node}", on_forget=sensor.forget,
    )  # fmt: skip
    sensor.add_callback(pipeline.on_event)
    service = SensorService(sensor, pipeline, config.sensor_socket(node))
    metrics = _served_metrics(config, node, sensor, pipeline, poster)
    stop = stop or asyncio.Event()
    await poster.start()
    with contextlib.suppress(CorralError, OSError):
        await containers.refresh()
    await sensor.start()
    await service.start()
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
        await service.stop()
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
        "Sensor events by stage; every alert ends delivered, enforced or suppressed",
        lambda: {"seen": s.events, "lost": s.lost, "dropped": s.dropped,
                 "evaluated": p.evaluated, "matched": p.matches,
                 "suppressed": pipeline.limiter.suppressed, "delivered": a.delivered,
                 "enforced": a.enforced, "held": a.held, "gaps": s.gaps,
                 "ticks": s.ticks, "ticks_behind": s.ticks_behind},
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
        "stats %s: events=%d lost=%d dropped=%d gaps=%d ticks=%d/%d behind evaluated=%d "
        "foreign=%d matches=%d suppressed=%d queued=%d delivered=%d enforced=%d held=%d "
        "retries=%d frozen=%d latency=%s", node, s.events, s.lost, s.dropped, s.gaps, s.ticks,
        s.ticks_behind, p.evaluated,
        p.foreign, p.matches, pipeline.limiter.suppressed, a.queued, a.delivered, a.enforced,
        a.held, a.retries, pipeline.enforcer.frozen if pipeline.enforcer else 0,
        a.percentiles() or "-",
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
