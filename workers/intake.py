"""Alert intake: Falco's HTTP JSON in, Temporal signals out.

Endpoints:

* ``POST /alerts``  — Falco ``http_output`` (``json_output: true``) and
  Corral's own sensor;
* ``POST /webhook`` — Falcosidekick's ``webhook`` output;
* ``GET /healthz``  — liveness, no token needed (it says nothing but "ok").

Both POST routes take the same body (see :mod:`policies.alert`). A request
needs ``Authorization: Bearer <token>`` or ``X-Corral-Token: <token>``; without
a valid one the intake answers 401 before it reads the body. Each alert is
parsed, de-duplicated (Falco and Falcosidekick may both be wired to the
intake, and both retry), decided by the response policy and handed to
``deliver``, which finds the episode and signals it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hmac
import logging
import os
import ssl
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, SecretStr
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

from contract.errors import CorralError
from policies.alert import ANOMALY_SIGNAL, Alert, MalformedAlert, parse_alert
from policies.responses import DEFAULT_RESPONSES, Decision, ResponsePolicy, load_responses

log = logging.getLogger("corral.intake")
# How long a starting intake waits for its port to be released (an intake just stopped).
BIND_WAIT_S = 15.0

DeliveryStatus = Literal["delivered", "ignored", "unknown_sandbox", "closed"]


class IntakeConfigError(CorralError):
    """The intake cannot start as configured (no token, bad settings)."""


class IntakeSettings(BaseModel):
    """How the intake listens and whom it believes."""

    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=8765, ge=0, le=65535)  # 0: pick a free port
    # More than one token lets a token be rotated without dropping alerts.
    tokens: list[SecretStr] = Field(min_length=1)
    responses: Path = DEFAULT_RESPONSES
    dedup_ttl_s: float = Field(default=600.0, gt=0)
    dedup_max: int = Field(default=100_000, gt=0)
    max_body_bytes: int = Field(default=1 << 20, gt=0)
    # Served when set; an intake listening beyond loopback refuses to start without.
    tls_cert: Path | None = None
    tls_key: Path | None = None


class DeliveryResult(BaseModel):
    """What ``deliver`` did with one alert."""

    status: DeliveryStatus
    workflow_id: str | None = None
    detail: str = ""


Deliver = Callable[[Alert, Decision], Awaitable[DeliveryResult]]
Resolver = Callable[[str], Awaitable[str | None]]


# --- dedup -----------------------------------------------------------------


class SeenAlerts:
    """An LRU set with a TTL: alert key -> (first seen, action decided).

    Bounded both ways so a flood of distinct alerts cannot grow memory, and a
    uuid reused much later (it should not be) is not dropped forever.
    """

    def __init__(self, ttl_s: float, max_items: int, clock: Callable[[], float] = time.monotonic):
        self._ttl = ttl_s
        self._max = max_items
        self._clock = clock
        self._items: OrderedDict[str, tuple[float, str]] = OrderedDict()

    def get(self, key: str) -> str | None:
        self._expire()
        item = self._items.get(key)
        return None if item is None else item[1]

    def add(self, key: str, action: str) -> None:
        self._items[key] = (self._clock(), action)
        self._items.move_to_end(key)
        while len(self._items) > self._max:
            self._items.popitem(last=False)

    def discard(self, key: str) -> None:
        self._items.pop(key, None)

    def _expire(self) -> None:
        cutoff = self._clock() - self._ttl
        while self._items:
            first_key, (seen, _) = next(iter(self._items.items()))
            if seen >= cutoff:
                break
            del self._items[first_key]

    def __len__(self) -> int:
        return len(self._items)


# --- auth ------------------------------------------------------------------


def _presented_token(request: web.Request) -> str | None:
    auth = request.headers.get("Authorization", "")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return request.headers.get("X-Corral-Token") or None


def _authorized(request: web.Request, tokens: list[SecretStr]) -> bool:
    presented = _presented_token(request)
    if presented is None:
        return False
    given = presented.encode()
    # Check every token (no early exit) so timing says nothing about which matched.
    matches = [hmac.compare_digest(given, t.get_secret_value().encode()) for t in tokens]
    return any(matches)


# --- handlers --------------------------------------------------------------

_SETTINGS = web.AppKey("settings", IntakeSettings)
_POLICY = web.AppKey("policy", ResponsePolicy)
_DELIVER: web.AppKey[Deliver] = web.AppKey("deliver")
_SEEN = web.AppKey("seen", SeenAlerts)
_LOCK = web.AppKey("lock", asyncio.Lock)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def _read_alert(request: web.Request, limit: int) -> Alert:
    if request.content_length is not None and request.content_length > limit:
        raise MalformedAlert(f"alert body is larger than {limit} bytes")
    body = await request.content.read(limit + 1)
    if len(body) > limit:
        raise MalformedAlert(f"alert body is larger than {limit} bytes")
    if not body:
        raise MalformedAlert("alert body is empty")
    return parse_alert(body)


async def _handle_alert(request: web.Request) -> web.Response:
    app = request.app
    settings = app[_SETTINGS]
    if not _authorized(request, settings.tokens):
        return _error(401, "missing or wrong token")
    try:
        alert = await _read_alert(request, settings.max_body_bytes)
    except MalformedAlert as exc:
        return _error(400, str(exc))
    return await _process(app, alert)


async def _process(app: web.Application, alert: Alert) -> web.Response:
    key, seen = alert.dedup_key(), app[_SEEN]
    async with app[_LOCK]:  # check-and-claim, so two copies in flight deliver once
        earlier = seen.get(key)
        if earlier is None:
            decision = app[_POLICY].decide(alert)
            seen.add(key, decision.action)
    if earlier is not None:
        return web.json_response({"status": "duplicate", "action": earlier, "rule": alert.rule})
    try:
        result = await app[_DELIVER](alert, decision)
    except Exception as exc:
        # Unclaim so the sender's retry is not mistaken for a duplicate.
        seen.discard(key)
        log.exception("delivering alert %s (%s) failed", key, alert.rule)
        return _error(503, f"delivery failed: {type(exc).__name__}: {exc}".splitlines()[0])
    return _respond(alert, decision, result, key, seen)


def _respond(
    alert: Alert, decision: Decision, result: DeliveryResult, key: str, seen: SeenAlerts
) -> web.Response:
    if result.status == "unknown_sandbox":
        seen.discard(key)  # the sandbox may register later; do not say "duplicate"
        return _error(404, f"unknown sandbox {alert.container_id}")
    if result.status == "closed":
        # Final: the sender enforces on the node (workers/sensor_delivery.py).
        seen.discard(key)
        return _error(410, f"episode {result.workflow_id} has closed")
    log.info(
        "alert %s rule=%r container=%s action=%s status=%s workflow=%s",
        key, alert.rule, alert.container_id, decision.action, result.status, result.workflow_id,
    )  # fmt: skip
    body: dict[str, Any] = {
        "status": result.status,
        "action": decision.action,
        "rule": alert.rule,
        "response": decision.response,
        "dry_run": decision.dry_run,
        "workflow_id": result.workflow_id,
    }
    return web.json_response(body)


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def create_app(
    settings: IntakeSettings,
    deliver: Deliver,
    *,
    policy: ResponsePolicy | None = None,
) -> web.Application:
    """Build the intake app; the response policy is loaded from settings unless given.

    Loading here (not per request) makes a bad responses file fail at start,
    with :class:`~policies.responses.ResponsePolicyError` naming the problem.
    """
    app = web.Application(client_max_size=settings.max_body_bytes)
    app[_SETTINGS] = settings
    app[_POLICY] = policy if policy is not None else load_responses(settings.responses)
    app[_DELIVER] = deliver
    app[_SEEN] = SeenAlerts(settings.dedup_ttl_s, settings.dedup_max)
    app[_LOCK] = asyncio.Lock()
    app.router.add_post("/alerts", _handle_alert)
    app.router.add_post("/webhook", _handle_alert)
    app.router.add_get("/healthz", _healthz)
    return app


async def run_intake(
    settings: IntakeSettings,
    deliver: Deliver,
    *,
    policy: ResponsePolicy | None = None,
    ready: asyncio.Event | None = None,
) -> None:
    """Serve until cancelled. ``ready`` is set once the socket is listening."""
    app = await create_app(settings, deliver, policy=policy)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, settings.host, settings.port, ssl_context=_ssl(settings))
        await _listen(site, settings.port)
        log.info("intake listening on %s", runner.addresses)
        if ready is not None:
            ready.set()
        await asyncio.Event().wait()  # until cancelled
    finally:
        await runner.cleanup()


async def _listen(site: web.TCPSite, port: int, wait_s: float = BIND_WAIT_S) -> None:
    """Bind, waiting a little while the port is still held: an intake stopped a
    moment ago (`corral down` then `up`) may not have released it yet."""
    deadline = asyncio.get_running_loop().time() + wait_s
    while True:
        try:
            await site.start()
            return
        except OSError as err:
            if err.errno != errno.EADDRINUSE or asyncio.get_running_loop().time() > deadline:
                raise
            log.warning("intake port %d still in use; trying again", port)
            await site.stop()  # unregisters it from the runner, so it can start again
            await asyncio.sleep(0.5)


def _ssl(settings: IntakeSettings) -> ssl.SSLContext | None:
    """TLS beyond loopback: alerts and the token cross a network there."""
    from workers.tls import is_loopback, server_context

    if settings.tls_cert and settings.tls_key:
        return server_context(settings.tls_cert, settings.tls_key)
    if not is_loopback(settings.host):
        raise IntakeConfigError(
            f"intake listens on {settings.host}, beyond loopback: set intake.tls_cert "
            "and intake.tls_key (CORRAL_INTAKE_TLS_CERT, CORRAL_INTAKE_TLS_KEY)"
        )
    return None


# --- delivery to Temporal ----------------------------------------------------


class TemporalDelivery:
    """Signals the episode workflow that owns the alert's container.

    The sensor names the episode in the alert (``WORKFLOW_ID_FIELD``); for
    other senders (real Falco) ``resolver`` maps the 12-hex container id to the
    workflow id (`workers.directory`: the SandboxId search attribute). Decisions of
    ``none`` are resolved (so an unknown container still answers 404) but not
    signalled.
    """

    def __init__(self, client: Client, resolver: Resolver) -> None:
        self._client = client
        self._resolve = resolver

    async def __call__(self, alert: Alert, decision: Decision) -> DeliveryResult:
        from workers.directory import WORKFLOW_ID_FIELD

        named = alert.output_fields.get(WORKFLOW_ID_FIELD)
        workflow_id = named if isinstance(named, str) and named else None
        workflow_id = workflow_id or await self._resolve(alert.container_id)
        if workflow_id is None:
            return DeliveryResult(status="unknown_sandbox")
        if decision.action == "none":
            return DeliveryResult(status="ignored", workflow_id=workflow_id)
        handle: WorkflowHandle[Any, Any] = self._client.get_workflow_handle(workflow_id)
        try:
            await handle.signal(ANOMALY_SIGNAL, anomaly_payload(alert, decision))
        except RPCError as exc:
            # Not found, or already closed: 410 when it did exist (the sensor then
            # enforces on the node), 404 when no such episode ever ran.
            if exc.status == RPCStatusCode.NOT_FOUND:
                status: DeliveryStatus = (
                    "closed" if await self._existed(handle) else "unknown_sandbox"
                )
                return DeliveryResult(status=status, workflow_id=workflow_id, detail=exc.message)
            raise
        return DeliveryResult(status="delivered", workflow_id=workflow_id)

    @staticmethod
    async def _existed(handle: WorkflowHandle[Any, Any]) -> bool:
        try:
            await handle.describe()
        except RPCError:
            return False
        return True


def anomaly_payload(alert: Alert, decision: Decision) -> dict[str, Any]:
    """The one argument of the ``anomaly`` signal."""
    return {"alert": alert.model_dump(mode="json"), "decision": decision.model_dump(mode="json")}


def load_token(token_env: str, token_file: Path | None = None) -> SecretStr:
    """The intake token from the environment, else from a file (as `corral up` writes it)."""
    value = os.environ.get(token_env, "").strip()
    if not value and token_file is not None and token_file.exists():
        value = token_file.read_text().strip()
    if not value:
        where = f"${token_env}" + (f" or {token_file}" if token_file else "")
        raise IntakeConfigError(f"no intake token: set {where}")
    return SecretStr(value)


# --- process entry point -----------------------------------------------------


async def serve_from_config(config_path: Path | None = None) -> None:
    """The intake of the dev stack: settings from `temporal-dev.yaml`."""
    from contract.config import load_config
    from observability.metrics import setup_metrics
    from workers.directory import EpisodeDirectory
    from workers.temporal import connect

    config = load_config(config_path)
    settings = IntakeSettings(
        host=config.intake.host,
        port=config.intake.port,
        tokens=[load_token(config.intake.token_env, config.intake_token_file)],
        responses=config.resolve(config.sensor.responses),
        tls_cert=config.resolve(config.intake.tls_cert) if config.intake.tls_cert else None,
        tls_key=config.resolve(config.intake.tls_key) if config.intake.tls_key else None,
    )
    client = await connect(config)
    delivery = TemporalDelivery(client, EpisodeDirectory(client).workflow_for)
    metrics = setup_metrics("corral-intake", prometheus_port=config.service_metrics_port())

    async def counted(alert: Alert, decision: Decision) -> DeliveryResult:
        result = await delivery(alert, decision)
        metrics.record_intake_alert(alert.rule, decision.action, result.status)
        return result

    await run_intake(settings, counted)


def main() -> None:
    import signal

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    async def _run() -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
        await serve_from_config()

    with contextlib.suppress(KeyboardInterrupt, asyncio.CancelledError):
        asyncio.run(_run())


if __name__ == "__main__":
    main()
