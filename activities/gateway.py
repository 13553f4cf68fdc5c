"""The node's model gateway: an OpenAI-compatible endpoint on each sandbox's loopback.

An episode whose spec has `model_gateway:` gets, in its sandbox's own network
namespace, a listener on 127.0.0.1:`MODEL_GATEWAY_PORT` that the node worker
serves (sandbox/loopback.py): reachable with network "none", reachable from
nowhere else. Its processes find it through `OPENAI_BASE_URL` and
`OPENAI_API_KEY` (the episode's own key, `activities.models.gateway_env`).

Each POST (chat completions, completions, embeddings, ...) is checked against
the key and the episode's budgets (`max_calls`, `max_tokens_per_episode`),
forwarded to the trainer's `upstream`, streamed back as it arrives, and
recorded as a `ModelCall`. A refused call gets an OpenAI-shaped error with
`x-should-retry: false`, so the client does not retry it. Calls are kept per
sandbox in a JSON-lines journal on the node (budgets and unreported calls
survive a worker restart) and handed to the step that ran while they ended
(`drain`): they travel in that step's `StepResult.model_calls`, i.e. in the
episode's history, its rollout and `corral export`. A call's index is the order
the agent made it in, not the order it ended in: a streamed call whose last
frame the agent read before it sent its next request may end after that one.

A call that starts under the token budget may end over it; the next one is
refused. Bodies beyond `RECORD_BYTES_PER_STEP` in one step keep their usage
and token figures but not their request and response text (a Temporal payload
holds 2 MB).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from pydantic import BaseModel

from activities.gateway_stream import StreamAssembly, TokenFacts
from contract.models import MODEL_GATEWAY_PORT, ModelCall, ModelGateway
from sandbox.loopback import listen_in_netns

__all__ = ["RECORD_BYTES_PER_STEP", "NodeGateway"]

log = logging.getLogger("corral.gateway")
RECORD_BYTES_PER_STEP = 256 * 1024
Listen = Callable[[int, int], socket.socket]  # (sandbox pid, port) -> listening socket
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
_NO_RETRY = {"x-should-retry": "false"}
_HUNG_UP = "model gateway: the agent hung up mid-stream"


class _Reported(BaseModel):
    """A journal line: these calls went out in a step's result."""

    reported: list[int]


class _Opened(BaseModel):
    """What `open` was given, kept so a restarted worker opens it again."""

    sandbox_id: str
    key: str
    spec: ModelGateway


@dataclass
class _Route:
    """One sandbox's gateway: its budgets, its journal, its calls not yet reported."""

    opened: _Opened
    journal: Path
    runner: web.AppRunner | None = None
    calls: int = 0  # started, refused ones excluded: what max_calls counts
    tokens: int = 0
    next_index: int = 0  # given when a call starts
    pending: list[ModelCall] = field(default_factory=list)

    def take_index(self) -> int:
        index, self.next_index = self.next_index, self.next_index + 1
        return index

    def refusal(self) -> str:
        spec = self.opened.spec
        if spec.max_calls is not None and self.calls >= spec.max_calls:
            return f"model gateway: this episode's max_calls ({spec.max_calls}) is used up"
        limit = spec.max_tokens_per_episode
        if limit is not None and self.tokens >= limit:
            return f"model gateway: this episode's max_tokens_per_episode ({limit}) is used up"
        return ""


_ROUTE = web.AppKey("route", _Route)


class NodeGateway:
    """Every open gateway of one node worker, by sandbox id."""

    def __init__(
        self, state_dir: Path, *, port: int = MODEL_GATEWAY_PORT, listen: Listen = listen_in_netns
    ) -> None:
        self._dir = Path(state_dir) / "gateway"
        self._port = port
        self._listen = listen
        self._routes: dict[str, _Route] = {}
        self._session: aiohttp.ClientSession | None = None

    # ------------------------------------------------------------ lifecycle
    async def open(self, sandbox_id: str, pid: int, spec: ModelGateway, key: str) -> None:
        """Serve `sandbox_id`'s loopback (idempotent: a retried provision reuses it)."""
        if sandbox_id in self._routes:
            return
        self._dir.mkdir(parents=True, exist_ok=True)
        opened = _Opened(sandbox_id=sandbox_id, key=key, spec=spec)
        route = _Route(opened=opened, journal=self._dir / f"{sandbox_id}.jsonl")
        _replay(route, self._dir / f"{sandbox_id}.reported")
        sock = await asyncio.to_thread(self._listen, pid, self._port)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app[_ROUTE] = route
        app.router.add_route("*", "/{path:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        try:
            await runner.setup()
            await web.SockSite(runner, sock).start()
        except BaseException:
            sock.close()
            await runner.cleanup()
            raise
        route.runner = runner
        (self._dir / f"{sandbox_id}.json").write_text(opened.model_dump_json())
        self._routes[sandbox_id] = route

    async def reopen(self, pid_of: Callable[[str], Any]) -> list[str]:
        """After a worker restart: serve again every sandbox that still lives
        (`pid_of(id)` awaits its PID 1, or raises when it is gone); forget the rest."""
        reopened: list[str] = []
        for path in sorted(self._dir.glob("*.json")) if self._dir.is_dir() else []:
            opened = _Opened.model_validate_json(path.read_text())
            try:
                pid = await pid_of(opened.sandbox_id)
                await self.open(opened.sandbox_id, pid, opened.spec, opened.key)
                reopened.append(opened.sandbox_id)
            except Exception as err:  # gone with its sandbox, or cannot listen: drop it
                log.info("gateway of %s not reopened: %s", opened.sandbox_id[:12], err)
                self._forget(opened.sandbox_id)
        return reopened

    def drain(self, sandbox_id: str) -> list[ModelCall]:
        """The calls ended since the last drain, for the step that reports them."""
        route = self._routes.get(sandbox_id)
        if route is None or not route.pending:
            return []
        calls, route.pending = sorted(route.pending, key=lambda c: c.index), []
        with route.journal.open("a") as journal:  # a restarted worker reports them no more
            journal.write(_Reported(reported=[c.index for c in calls]).model_dump_json() + "\n")
        return _fit(calls, RECORD_BYTES_PER_STEP)

    async def close(self, sandbox_id: str) -> None:
        """Stop serving the sandbox (its teardown) and drop its journal."""
        route = self._routes.pop(sandbox_id, None)
        if route is not None and route.runner is not None:
            await route.runner.cleanup()
        self._forget(sandbox_id)

    async def stop(self) -> None:
        """The worker stops: listeners close, journals stay for the next worker."""
        for route in list(self._routes.values()):
            if route.runner is not None:
                await route.runner.cleanup()
        self._routes.clear()
        if self._session is not None:
            await self._session.close()

    def _forget(self, sandbox_id: str) -> None:
        for suffix in (".json", ".jsonl", ".reported"):
            (self._dir / f"{sandbox_id}{suffix}").unlink(missing_ok=True)

    # --------------------------------------------------------------- serving
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        route = request.app[_ROUTE]
        path = request.match_info["path"].removeprefix("v1/")  # relative to the upstream's URL
        if request.headers.get("Authorization", "") != f"Bearer {route.opened.key}":
            return _error(401, "model gateway: wrong or missing API key", "invalid_api_key")
        if request.method != "POST":  # GET /v1/models and the like: passed through, not recorded
            return await self._forward_plain(route, request.method, path, None)
        started, clock = datetime.now(UTC), time.monotonic()
        try:
            body = json.loads(await request.read() or b"{}")
            if not isinstance(body, dict):
                raise ValueError("the body is not a JSON object")
        except ValueError as err:
            return _error(400, f"model gateway: request body is not JSON: {err}", "invalid_request")
        call = _Call(route, path, body, started, clock)
        refused = route.refusal()
        if refused:
            self._record(route, call.refused(429, refused))
            return _error(429, refused, "budget_exceeded")
        route.calls += 1
        return await self._forward_call(route, request, call)

    async def _forward_call(
        self, route: _Route, request: web.Request, call: _Call
    ) -> web.StreamResponse:
        try:
            if call.stream:
                return await self._forward_stream(route, request, call)
            response = await self._forward_plain(route, "POST", call.path, call.body)
            call.finish(response.status, _json_or_none(response.body))
            return response
        except ConnectionResetError:
            if not call.finished:
                call.finish(499, None, error=_HUNG_UP)
            raise
        except (aiohttp.ClientError, TimeoutError) as err:
            reason = f"model gateway: upstream {route.opened.spec.upstream} failed: {err!r}"
            call.finish(502, None, error=reason)
            return _error(502, reason, "upstream_error")
        finally:
            self._record(route, call.record())

    async def _forward_plain(
        self, route: _Route, method: str, path: str, body: dict[str, Any] | None
    ) -> web.Response:
        async with self._upstream(route, method, path, body) as upstream:
            data = await upstream.read()
            return web.Response(
                status=upstream.status,
                body=data,
                content_type=upstream.content_type or "application/json",
            )

    async def _forward_stream(
        self, route: _Route, request: web.Request, call: _Call
    ) -> web.StreamResponse:
        async with self._upstream(route, "POST", call.path, call.upstream_body()) as up:
            if up.status != 200:
                data = await up.read()
                call.finish(up.status, _json_or_none(data))
                return web.Response(status=up.status, body=data, content_type=up.content_type)
            out = web.StreamResponse(status=200, headers=_SSE_HEADERS)
            await out.prepare(request)
            assembly = StreamAssembly()
            try:
                async for event in _events(up.content):
                    chunk = _json_or_none(event.removeprefix(b"data:").strip())
                    if chunk is not None:
                        assembly.feed(chunk)
                        if call.hide_usage_chunk and not chunk.get("choices"):
                            continue  # the usage chunk the gateway asked for, not the agent
                    await out.write(event + b"\n\n")
            except ConnectionResetError:
                # The agent hung up mid-stream: what it was sent is kept beside the 499.
                call.finish(499, assembly.result(), error=_HUNG_UP)
                raise
            # Everything the upstream sent reached the agent: the call is whole even if the
            # agent, having read [DONE], closes before the chunked body's last frame.
            call.finish(200, assembly.result())
            with contextlib.suppress(ConnectionResetError):
                await out.write_eof()
            return out

    @contextlib.asynccontextmanager
    async def _upstream(
        self, route: _Route, method: str, path: str, body: dict[str, Any] | None
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        spec = route.opened.spec
        if self._session is None:
            self._session = aiohttp.ClientSession()
        headers = (
            {"Authorization": f"Bearer {spec.upstream_api_key}"} if spec.upstream_api_key else {}
        )
        url = spec.upstream.rstrip("/") + "/" + path
        timeout = aiohttp.ClientTimeout(total=spec.upstream_timeout_s)
        async with self._session.request(
            method, url, json=body, headers=headers, timeout=timeout
        ) as response:
            yield response

    def _record(self, route: _Route, call: ModelCall) -> None:
        route.tokens += call.total_tokens
        with route.journal.open("a") as journal:
            journal.write(call.model_dump_json() + "\n")
        route.pending.append(call)


class _Call:
    """One call in flight: what it asked, when, and (once done) what it got."""

    def __init__(
        self, route: _Route, path: str, body: dict[str, Any], started: datetime, clock: float
    ) -> None:
        self.path, self.body = path, body
        self.stream = bool(body.get("stream"))
        options = body.get("stream_options")
        # Token budgets need the usage of a streamed call: ask for it, and keep
        # that extra chunk from an agent that did not ask.
        self.hide_usage_chunk = self.stream and not (
            isinstance(options, dict) and options.get("include_usage")
        )
        self._started, self._clock = started, clock
        self.index = route.take_index()
        self._status, self._error = 0, ""
        self._response: dict[str, Any] | None = None

    def upstream_body(self) -> dict[str, Any]:
        if not self.hide_usage_chunk:
            return self.body
        options = self.body.get("stream_options")
        return {**self.body, "stream_options": {**(options or {}), "include_usage": True}}

    def finish(self, status: int, response: dict[str, Any] | None, error: str = "") -> None:
        self._status, self._response, self._error = status, response, error

    @property
    def finished(self) -> bool:
        return self._status != 0

    def refused(self, status: int, reason: str) -> ModelCall:
        self.finish(status, None, error=reason)
        return self.record()

    def record(self) -> ModelCall:
        response: dict[str, Any] = self._response or {}
        facts = TokenFacts(response)
        return ModelCall(
            index=self.index,
            endpoint=self.path,
            model=str(response.get("model") or self.body.get("model") or ""),
            started_at=self._started,
            latency_ms=(time.monotonic() - self._clock) * 1000,
            status=self._status,
            stream=self.stream,
            prompt_tokens=facts.prompt_tokens,
            completion_tokens=facts.completion_tokens,
            total_tokens=facts.total_tokens,
            prompt_token_ids=facts.prompt_token_ids,
            completion_token_ids=facts.completion_token_ids,
            logprobs=facts.logprobs,
            request_json=json.dumps(self.body),
            response_json=json.dumps(self._response) if self._response is not None else "",
            error=self._error,
        )


def _replay(route: _Route, reported_file: Path) -> None:
    """Budgets and unreported calls from the journal a previous worker left.

    `reported_file` is the watermark workers before journal `reported` lines
    kept: every call below it was reported."""
    if not route.journal.is_file():
        return
    below = int(reported_file.read_text() or 0) if reported_file.is_file() else 0
    calls: list[ModelCall] = []
    reported: set[int] = set()
    for line in route.journal.read_text().splitlines():
        if line.startswith('{"reported"'):
            reported.update(_Reported.model_validate_json(line).reported)
            continue
        call = ModelCall.model_validate_json(line)
        calls.append(call)
        route.tokens += call.total_tokens
        route.calls += 0 if call.status == 429 and call.error else 1
        route.next_index = max(route.next_index, call.index + 1)
    route.pending = [c for c in calls if c.index >= below and c.index not in reported]


def _fit(calls: list[ModelCall], budget: int) -> list[ModelCall]:
    """Bodies while they fit in `budget` bytes; past it, usage and timing only."""
    fitted: list[ModelCall] = []
    for call in calls:
        size = len(call.request_json) + len(call.response_json)
        budget -= size
        fitted.append(call if budget >= 0 else call.summary())
    return fitted


async def _events(stream: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """Server-sent events, each without its blank-line terminator."""
    buffer = b""
    async for piece in stream.iter_any():
        buffer += piece
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            if event.strip():
                yield event
    if buffer.strip():
        yield buffer


def _json_or_none(data: bytes | Any) -> dict[str, Any] | None:
    if not isinstance(data, bytes | bytearray) or not data or data == b"[DONE]":
        return None
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _error(status: int, message: str, code: str) -> web.Response:
    body = {"error": {"message": message, "type": code, "code": code, "param": None}}
    return web.json_response(body, status=status, headers=_NO_RETRY)
