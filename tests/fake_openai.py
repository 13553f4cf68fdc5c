"""A small OpenAI-compatible server for the model gateway's tests.

Chat completions and text completions, streamed or not, with usage, log-probs
when asked (`logprobs`), and vLLM's token ids when asked (`return_token_ids`).
The answer is deterministic: "echo: " and the last user message, one token per
word. Every request body it received is kept in `requests`.

Run alone (`python tests/fake_openai.py PORT`) for a manual try.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from aiohttp import web

__all__ = ["FakeOpenAI"]


class FakeOpenAI:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.app = web.Application()
        self.app.router.add_post("/v1/chat/completions", self._chat)
        self.app.router.add_post("/v1/completions", self._text)
        self.app.router.add_get("/v1/models", self._models)
        self._runner: web.AppRunner | None = None
        self.port = 0
        # A server may hold a stream open a moment after [DONE] (vLLM's keep-alive, a proxy):
        # the agent has everything by then and may hang up first.
        self.linger_after_done_s = 0.0

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve; returns the base URL (…/v1)."""
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        server = site._server
        assert server is not None and server.sockets  # type: ignore[attr-defined]
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        return f"http://{host}:{self.port}/v1"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _models(self, _: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake-1", "object": "model"}]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        messages = body.get("messages") or [{}]
        words = ("echo: " + str(messages[-1].get("content", ""))).split()
        return await self._answer(request, body, words, chat=True)

    async def _text(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        words = ("echo: " + str(body.get("prompt", ""))).split()
        return await self._answer(request, body, words, chat=False)

    async def _body(self, request: web.Request) -> dict[str, Any]:
        body = await request.json()
        self.requests.append(body)
        return dict(body)

    async def _answer(
        self, request: web.Request, body: dict[str, Any], words: list[str], *, chat: bool
    ) -> web.StreamResponse:
        prompt_tokens = len(json.dumps(body.get("messages") or body.get("prompt")).split())
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": len(words),
            "total_tokens": prompt_tokens + len(words),
        }
        head = {"id": "cmpl-fake", "created": int(time.time()), "model": body.get("model", "")}
        ids = body.get("return_token_ids")
        if not body.get("stream"):
            choice = _choice(words, chat=chat, logprobs=bool(body.get("logprobs")), ids=ids)
            obj = "chat.completion" if chat else "text_completion"
            extra = {"prompt_token_ids": list(range(prompt_tokens))} if ids else {}
            return web.json_response(
                {**head, "object": obj, "choices": [choice], "usage": usage, **extra}
            )
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        obj = "chat.completion.chunk" if chat else "text_completion"
        for n, word in enumerate(words):
            text = word if n == 0 else " " + word
            delta: dict[str, Any] = (
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": text}
                    if n == 0
                    else {"content": text},
                }
                if chat
                else {"index": 0, "text": text}
            )
            if ids:
                delta["token_ids"] = [1000 + n]
            delta["finish_reason"] = "stop" if n == len(words) - 1 else None
            await out.write(_event({**head, "object": obj, "choices": [delta]}))
            await asyncio.sleep(0.01)
        if (body.get("stream_options") or {}).get("include_usage"):
            await out.write(_event({**head, "object": obj, "choices": [], "usage": usage}))
        await out.write(b"data: [DONE]\n\n")
        await asyncio.sleep(self.linger_after_done_s)
        await out.write_eof()
        return out


def _choice(words: list[str], *, chat: bool, logprobs: bool, ids: Any) -> dict[str, Any]:
    text = " ".join(words)
    choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
        if logprobs:
            choice["logprobs"] = {
                "content": [{"token": w, "logprob": -0.5, "top_logprobs": []} for w in words]
            }
    else:
        choice["text"] = text
        if logprobs:
            choice["logprobs"] = {"tokens": words, "token_logprobs": [-0.5] * len(words)}
    if ids:
        choice["token_ids"] = [1000 + n for n in range(len(words))]
    return choice


def _event(chunk: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


async def _serve(port: int) -> None:
    fake = FakeOpenAI()
    print(await fake.start(port=port), flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(_serve(int(sys.argv[1]) if len(sys.argv) > 1 else 8000))
