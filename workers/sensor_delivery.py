"""What becomes of an alert once a rule matched: it is never dropped.

Every alert the rate limit lets through ends in exactly one of two ways:

* **delivered**: the intake answered 2xx (it signalled the episode);
* **enforced**: the node applied the response policy itself (``LocalEnforcer``:
  kill destroys the sandbox, quarantine freezes it) and recorded it in
  ``<state>/run/enforced-<node>.jsonl``, because the episode has closed (the
  intake answers 410), the intake refused the alert for good (another 4xx),
  the owner could not be reached for ``hold_s`` (404 while a new sandbox's
  episode is not known yet, 5xx, no connection), or the queue was full.

While an alert waits for its owner it is **held** (counted) and retried with
back-off. Alerts the rule's own rate limit folds into an earlier one are
**suppressed** (``RateLimiter``). Nothing else happens to an alert.

Freezing in place: when an alert's decision is kill or quarantine, the node
freezes the sandbox at once (``LocalEnforcer.freeze_now``), the way Tetragon
enforces in the kernel's neighbourhood instead of waiting for a control plane.
The episode's own freeze then finds it frozen; a release thaws it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import aiohttp

from contract.errors import CorralError, SandboxNotFound
from policies.alert import Alert
from policies.responses import Decision, ResponsePolicy

log = logging.getLogger("corral.sensor.delivery")

Outcome = Literal["delivered", "enforced"]
OnDone = Callable[[Outcome], None]
Enforce = Callable[[dict[str, Any], str], Awaitable[None]]
HOLD_S = 30.0  # how long an alert waits for its owner before the node enforces it


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
    delivered: int = 0  # the intake answered 2xx
    enforced: int = 0  # applied on the node (closed, refused, undeliverable, queue full)
    held: int = 0  # waiting for their owner right now
    retries: int = 0
    latencies_ms: deque[float] = field(default_factory=lambda: deque(maxlen=2048))
    last_status: dict[str, Any] = field(default_factory=dict)

    def percentiles(self) -> dict[str, float]:
        data = sorted(self.latencies_ms)
        if not data:
            return {}

        def pct(p: float) -> float:
            return data[min(len(data) - 1, int(p * len(data)))]

        return {"p50_ms": pct(0.5), "p99_ms": pct(0.99), "max_ms": data[-1], "n": len(data)}


@dataclass
class _Queued:
    body: dict[str, Any]
    event_ts_ns: int
    on_done: OnDone | None
    since: float  # monotonic, when submitted


class AlertPoster:
    """Bounded queue + posters: POST alert bodies to the intake, never blocking the caller.

    ``enforce(body, reason)`` is called for every alert that cannot be
    delivered; without one (unit tests of the posting alone) such alerts are
    only counted as enforced.
    """

    def __init__(
        self,
        url: str,
        token: str,
        *,
        enforce: Enforce | None = None,
        queue_size: int = 1000,
        workers: int = 4,
        hold_s: float = HOLD_S,
        backoff_s: tuple[float, float] = (0.1, 2.0),
        timeout_s: float = 10.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.url = url
        self._ssl = ssl_context  # https: verify the intake against the configured CA
        self._headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self._enforce = enforce
        self._queue: deque[_Queued] = deque()
        self._queue_size = queue_size
        self._wake = asyncio.Event()
        self._n_workers = workers
        self._hold_s = hold_s
        self._backoff = backoff_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._tasks: list[asyncio.Task[None]] = []
        self._side: set[asyncio.Task[None]] = set()
        self._session: aiohttp.ClientSession | None = None
        self._inflight = 0
        self.stats = PosterStats()

    def submit(self, body: dict[str, Any], event_ts_ns: int, on_done: OnDone | None = None) -> None:
        """Queue one alert (``event_ts_ns``: CLOCK_MONOTONIC of the syscall)."""
        self.stats.queued += 1
        item = _Queued(body, event_ts_ns, on_done, time.monotonic())
        if len(self._queue) >= self._queue_size:
            self._spawn(self._give_up(item, "queue full"))
            return
        self._queue.append(item)
        self._wake.set()

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=self._timeout)
        self._tasks = [
            asyncio.create_task(self._worker(), name=f"alert-poster-{i}")
            for i in range(self._n_workers)
        ]

    def busy(self) -> bool:
        return bool(self._queue or self._inflight or self._side)

    async def drain(self, timeout_s: float = 5.0) -> None:
        """Wait (bounded) until queued alerts are delivered or enforced."""
        deadline = time.monotonic() + timeout_s
        while self.busy() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        for task in [*self._tasks, *self._side]:
            task.cancel()
        for task in [*self._tasks, *self._side]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._side.add(task)
        task.add_done_callback(self._side.discard)

    async def _worker(self) -> None:
        while True:
            while not self._queue:
                self._wake.clear()
                await self._wake.wait()
            item = self._queue.popleft()
            self._inflight += 1
            try:
                await self._post(item)
            finally:
                self._inflight -= 1

    async def _post(self, item: _Queued) -> None:
        assert self._session is not None
        data = json.dumps(item.body).encode()
        delay = self._backoff[0]
        rule, cid = item.body.get("rule"), item.body["output_fields"].get("container.id")
        held = False
        try:
            while True:
                status, text = await self._send_once(data)
                if 200 <= status < 300:
                    self._delivered(item, text)
                    return
                if status == 410 or (400 <= status < 500 and status != 404):
                    # 410: the episode has closed; other 4xx: refused for good.
                    why = "episode closed" if status == 410 else f"refused {status}"
                    log.warning("alert rule=%r container=%s %s: %s", rule, cid, why, text[:200])
                    await self._give_up(item, f"{why}: {text[:200]}")
                    return
                # 404 (owner not known yet), 5xx, no answer: hold and retry.
                if time.monotonic() - item.since >= self._hold_s:
                    log.error("alert rule=%r container=%s not delivered in %.0f s: %s %s",
                              rule, cid, self._hold_s, status, text[:200])  # fmt: skip
                    await self._give_up(item, f"undeliverable: {status} {text[:200]}")
                    return
                if not held:
                    held = True
                    self.stats.held += 1
                self.stats.retries += 1
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._backoff[1])
        finally:
            if held:
                self.stats.held -= 1

    async def _send_once(self, data: bytes) -> tuple[int, str]:
        assert self._session is not None
        try:
            async with self._session.post(
                self.url, data=data, headers=self._headers, ssl=self._ssl or True
            ) as resp:
                return resp.status, await resp.text()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            return 0, f"{type(exc).__name__}: {exc}"

    def _delivered(self, item: _Queued, text: str) -> None:
        self.stats.delivered += 1
        latency = (time.monotonic_ns() - item.event_ts_ns) / 1e6 if item.event_ts_ns else None
        if latency is not None:
            self.stats.latencies_ms.append(latency)
        with contextlib.suppress(ValueError):
            self.stats.last_status = json.loads(text)
        log.info("alert rule=%r container=%s delivered latency_ms=%s answer=%s output=%s",
                 item.body.get("rule"), item.body["output_fields"].get("container.id"),
                 f"{latency:.1f}" if latency is not None else "?", text[:200],
                 str(item.body.get("output", ""))[:500])  # fmt: skip
        if item.on_done is not None:
            item.on_done("delivered")

    async def _give_up(self, item: _Queued, reason: str) -> None:
        """The node enforces what the intake could not be told."""
        try:
            if self._enforce is not None:
                await self._enforce(item.body, reason)
        except Exception:  # enforcement must not kill the poster; it is logged
            log.exception("enforcing alert %s on the node failed", item.body.get("rule"))
        finally:
            self.stats.enforced += 1
            if item.on_done is not None:
                item.on_done("enforced")


# ------------------------------------------------------------- on the node


SandboxAction = Callable[[str], Awaitable[None]]


class LocalEnforcer:
    """Applies the response policy on the node, and records what it did.

    ``destroy`` and ``pause`` act on a sandbox by its full id through the
    node's containerd (``workers.sensor.NodeContainers``).
    """

    def __init__(
        self,
        policy: ResponsePolicy,
        *,
        destroy: SandboxAction,
        pause: SandboxAction,
        enforced_record: Path,
        frozen_record: Path,
    ) -> None:
        self.policy = policy
        self._destroy = destroy
        self._pause = pause
        self._enforced_record = enforced_record
        self._frozen_record = frozen_record
        self.frozen = 0

    def decide(self, body: dict[str, Any]) -> Decision:
        return self.policy.decide(Alert.model_validate(body))

    async def enforce(self, body: dict[str, Any], reason: str) -> None:
        """Kill or freeze the alert's sandbox as its decision says (the intake is not there)."""
        decision = self.decide(body)
        sandbox_id = str(body["output_fields"].get("container.full_id") or "")
        done = "nothing"
        if _owner(body) is None:
            # Not an episode's (a policy test's, a bench's, an idle pool sandbox):
            # whoever made it owns its fate; the alert is recorded.
            done = "no episode owns the sandbox"
        elif sandbox_id and decision.action in ("kill", "quarantine"):
            act = self._destroy if decision.action == "kill" else self._pause
            try:
                await act(sandbox_id)
                done = "destroyed" if decision.action == "kill" else "frozen"
            except SandboxNotFound:
                done = "already gone"
            except CorralError as err:
                done = f"failed: {err}"
        log.warning("alert rule=%r sandbox=%s enforced on the node (%s): %s -> %s",
                    body.get("rule"), sandbox_id[:12], reason, decision.action, done)  # fmt: skip
        _append(self._enforced_record, {
            "time_ns": time.time_ns(), "reason": reason, "rule": body.get("rule"),
            "sandbox_id": sandbox_id, "workflow_id": _owner(body),
            "action": decision.action, "result": done,
        })  # fmt: skip

    async def freeze_now(
        self, body: dict[str, Any], decision: Decision, event_wall_ns: int | None
    ) -> None:
        """Freeze an episode's sandbox the moment a kill or quarantine alert matched."""
        sandbox_id = str(body["output_fields"].get("container.full_id") or "")
        try:
            await self._pause(sandbox_id)
        except SandboxNotFound:
            return
        except CorralError as err:  # already paused, or stopping: the episode still acts
            log.info("in-place freeze of %s skipped: %s", sandbox_id[:12], err)
            return
        self.frozen += 1
        _append(self._frozen_record, {
            "sandbox_id": sandbox_id, "workflow_id": _owner(body), "rule": body.get("rule"),
            "action": decision.action, "event_wall_ns": event_wall_ns,
            "frozen_wall_ns": time.time_ns(),
        })  # fmt: skip


def _owner(body: dict[str, Any]) -> str | None:
    from workers.directory import WORKFLOW_ID_FIELD

    owner = body["output_fields"].get(WORKFLOW_ID_FIELD)
    return owner if isinstance(owner, str) else None


def _append(path: Path, record: dict[str, Any]) -> None:
    """One JSON line; on-call reads these files (`docs/policies.md`)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(json.dumps(record) + "\n")
    except OSError as err:
        log.error("cannot record to %s: %s", path, err)
