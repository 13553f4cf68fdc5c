"""The node's model gateway (activities/gateway.py) against a fake OpenAI server,
driven by the real `openai` client. The gateway's socket is on the host's
loopback here: the sandbox's own loopback is the integration test's
(tests/integration/trainer/test_model_gateway_sandbox.py)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from activities.gateway import NodeGateway
from activities.gateway_stream import StreamAssembly
from contract.errors import NetworkError
from contract.models import ModelGateway
from sandbox.loopback import listen_in_netns
from tests.fake_openai import FakeOpenAI

KEY = "corral-test-key"


class HostLoopback:
    """`listen` for the gateway: a socket on the host's 127.0.0.1, port chosen by the kernel."""

    def __init__(self) -> None:
        self.ports: dict[int, int] = {}  # pid -> port

    def __call__(self, pid: int, _port: int) -> socket.socket:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        sock.setblocking(False)
        self.ports[pid] = sock.getsockname()[1]
        return sock


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[tuple[NodeGateway, HostLoopback]]:
    loopback = HostLoopback()
    gw = NodeGateway(tmp_path, listen=loopback)
    yield gw, loopback
    await gw.stop()


def spec_for(fake: FakeOpenAI, **budgets: int) -> ModelGateway:
    return ModelGateway(upstream=f"http://127.0.0.1:{fake.port}/v1", **budgets)  # type: ignore[arg-type]


def client_for(loopback: HostLoopback, pid: int, key: str = KEY) -> openai.AsyncOpenAI:
    base = f"http://127.0.0.1:{loopback.ports[pid]}/v1"
    return openai.AsyncOpenAI(base_url=base, api_key=key, max_retries=0)


async def test_a_call_is_forwarded_and_recorded_with_its_tokens(
    gateway: tuple[NodeGateway, HostLoopback], fake_openai: FakeOpenAI
) -> None:
    gw, loopback = gateway
    await gw.open("a" * 64, 1, spec_for(fake_openai), KEY)
    client = client_for(loopback, 1)
    reply = await client.chat.completions.create(
        model="fake-1",
        messages=[{"role": "user", "content": "hello there"}],
        logprobs=True,
        extra_body={"return_token_ids": True},
    )
    assert reply.choices[0].message.content == "echo: hello there"
    [call] = gw.drain("a" * 64)
    assert (call.index, call.endpoint, call.model, call.status) == (
        0,
        "chat/completions",
        "fake-1",
        200,
    )
    assert call.completion_tokens == 3 and call.total_tokens == call.prompt_tokens + 3
    assert call.completion_token_ids == [1000, 1001, 1002]
    assert call.prompt_token_ids is not None and call.logprobs == [-0.5, -0.5, -0.5]
    assert json.loads(call.request_json)["messages"][0]["content"] == "hello there"
    assert json.loads(call.response_json)["choices"][0]["message"]["content"] == "echo: hello there"
    assert gw.drain("a" * 64) == []  # reported once


async def test_a_streamed_call_streams_and_is_recorded_whole(
    gateway: tuple[NodeGateway, HostLoopback], fake_openai: FakeOpenAI
) -> None:
    gw, loopback = gateway
    await gw.open("b" * 64, 2, spec_for(fake_openai, max_tokens_per_episode=10_000), KEY)
    stream = await client_for(loopback, 2).chat.completions.create(
        model="fake-1", messages=[{"role": "user", "content": "one two three"}], stream=True
    )
    chunks = [chunk async for chunk in stream]
    # The usage chunk the gateway asked for (to count tokens) is not the agent's.
    assert all(chunk.choices for chunk in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "echo: one two three"
    assert fake_openai.requests[-1]["stream_options"] == {"include_usage": True}
    [call] = gw.drain("b" * 64)
    assert call.stream and call.completion_tokens == 4
    response = json.loads(call.response_json)
    assert response["object"] == "chat.completion"
    assert response["choices"][0]["message"] == {
        "role": "assistant",
        "content": "echo: one two three",
    }


async def _read_stream_then_hang_up(port: int, stop_after: bytes) -> bytes:
    """A raw agent: posts a streamed chat call, reads until `stop_after`, closes at once."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps(
        {"model": "fake-1", "stream": True, "messages": [{"role": "user", "content": "a b c d"}]}
    ).encode()
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
        + f"Authorization: Bearer {KEY}\r\nContent-Type: application/json\r\n".encode()
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    seen = b""
    while stop_after not in seen:
        piece = await asyncio.wait_for(reader.read(4096), timeout=10)
        assert piece, f"the stream ended before {stop_after!r}: {seen!r}"
        seen += piece
    writer.transport.abort()  # a hang-up, not a polite close
    return seen


async def _drained(gw: NodeGateway, sandbox_id: str) -> list[Any]:
    for _ in range(200):  # the gateway records once its handler returns, after the hang-up
        calls = gw.drain(sandbox_id)
        if calls:
            return calls
        await asyncio.sleep(0.01)
    raise AssertionError("the gateway recorded no call")


async def test_an_agent_that_hangs_up_after_done_has_its_whole_call_recorded(
    gateway: tuple[NodeGateway, HostLoopback], fake_openai: FakeOpenAI
) -> None:
    # The server keeps the stream open after [DONE]; the agent has all it needs and leaves.
    fake_openai.linger_after_done_s = 0.3
    gw, loopback = gateway
    await gw.open("9" * 64, 9, spec_for(fake_openai), KEY)
    await _read_stream_then_hang_up(loopback.ports[9], b"[DONE]")
    [call] = await _drained(gw, "9" * 64)
    assert (call.status, call.error, call.completion_tokens) == (200, "", 5)
    assert json.loads(call.response_json)["choices"][0]["message"]["content"] == "echo: a b c d"


async def test_calls_are_numbered_in_the_order_the_agent_made_them(
    gateway: tuple[NodeGateway, HostLoopback], fake_openai: FakeOpenAI
) -> None:
    # The stream stays open after [DONE], so the agent's next call ends before it does
    # (a CI run saw the refusal that followed a stream take the stream's place).
    fake_openai.linger_after_done_s = 0.3
    gw, loopback = gateway
    await gw.open("7" * 64, 7, spec_for(fake_openai, max_calls=1), KEY)
    client = client_for(loopback, 7)
    stream = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "a b"}], stream=True
    )
    assert "".join([c.choices[0].delta.content or "" async for c in stream]) == "echo: a b"
    with pytest.raises(openai.RateLimitError):
        await client.completions.create(model="m", prompt="over")
    await asyncio.sleep(0.5)  # the stream's handler returns after the linger
    calls = gw.drain("7" * 64)
    assert [(c.index, c.status, c.stream) for c in calls] == [(0, 200, True), (1, 429, False)]


async def test_a_restarted_worker_reports_only_what_no_step_reported(
    tmp_path: Path, fake_openai: FakeOpenAI
) -> None:
    loopback = HostLoopback()
    first = NodeGateway(tmp_path, listen=loopback)
    await first.open("6" * 64, 6, spec_for(fake_openai), KEY)
    client = client_for(loopback, 6)
    await client.completions.create(model="m", prompt="one")
    assert [c.index for c in first.drain("6" * 64)] == [0]
    await client.completions.create(model="m", prompt="two")
    await first.stop()

    again = NodeGateway(tmp_path, listen=loopback)

    async def pid_of(_: str) -> int:
        return 6

    await again.reopen(pid_of)
    await client_for(loopback, 6).completions.create(model="m", prompt="three")
    assert [c.index for c in again.drain("6" * 64)] == [1, 2]
    await again.close("6" * 64)
    await again.stop()


async def test_an_agent_that_hangs_up_mid_stream_is_a_499_with_what_it_was_sent(
    gateway: tuple[NodeGateway, HostLoopback], fake_openai: FakeOpenAI
) -> None:
    gw, loopback = gateway
    await gw.open("8" * 64, 8, spec_for(fake_openai), KEY)
    await _read_stream_then_hang_up(loopback.ports[8], b"echo:")
    [call] = await _drained(gw, "8" * 64)
    assert call.status == 499 and "hung up mid-stream" in call.error
    assert json.loads(call.response_json)["choices"][0]["message"]["content"].startswith("echo:")


async def test_a_wrong_key_is_refused_and_not_recorded(
    gateway: tuple[NodeGateway, HostLoopback], fake_openai: FakeOpenAI
) -> None:
    gw, loopback = gateway
    await gw.open("c" * 64, 3, spec_for(fake_openai), KEY)
    with pytest.raises(openai.AuthenticationError):
        await client_for(loopback, 3, key="not-the-key").models.list()
    assert gw.drain("c" * 64) == [] and fake_openai.requests == []


async def test_budgets_refuse_further_calls_without_retries(
    gateway: tuple[NodeGateway, HostLoopback], fake_openai: FakeOpenAI
) -> None:
    gw, loopback = gateway
    await gw.open("d" * 64, 4, spec_for(fake_openai, max_calls=1), KEY)
    await gw.open("e" * 64, 5, spec_for(fake_openai, max_tokens_per_episode=5), KEY)
    for pid in (4, 5):
        client = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{loopback.ports[pid]}/v1", api_key=KEY, max_retries=3
        )
        await client.completions.create(model="fake-1", prompt="a b c")
        with pytest.raises(openai.RateLimitError, match="is used up"):
            await client.completions.create(model="fake-1", prompt="again")
    assert len(fake_openai.requests) == 2  # one each: refusals never reach it, nor are retried
    first, refused = gw.drain("d" * 64)
    assert first.status == 200 and (refused.status, refused.index) == (429, 1)
    assert "max_calls (1)" in refused.error
    assert "max_tokens_per_episode (5)" in gw.drain("e" * 64)[1].error


async def test_an_unreachable_upstream_is_a_502_on_record(
    gateway: tuple[NodeGateway, HostLoopback],
) -> None:
    gw, loopback = gateway
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    await gw.open("f" * 64, 6, ModelGateway(upstream=f"http://127.0.0.1:{port}/v1"), KEY)
    with pytest.raises(openai.InternalServerError):
        await client_for(loopback, 6).completions.create(model="m", prompt="x")
    [call] = gw.drain("f" * 64)
    assert call.status == 502 and "failed" in call.error


async def test_a_restarted_worker_keeps_budgets_and_unreported_calls(
    tmp_path: Path, fake_openai: FakeOpenAI
) -> None:
    loopback = HostLoopback()
    first = NodeGateway(tmp_path, listen=loopback)
    await first.open("9" * 64, 7, spec_for(fake_openai, max_calls=2), KEY)
    await client_for(loopback, 7).completions.create(model="m", prompt="before")
    await first.stop()

    again = NodeGateway(tmp_path, listen=loopback)

    async def pid_of(sandbox_id: str) -> int:
        if sandbox_id != "9" * 64:
            raise LookupError(sandbox_id)
        return 7

    assert await again.reopen(pid_of) == ["9" * 64]
    client = client_for(loopback, 7)
    await client.completions.create(model="m", prompt="after")
    with pytest.raises(openai.RateLimitError):
        await client.completions.create(model="m", prompt="over")
    assert [c.index for c in again.drain("9" * 64)] == [0, 1, 2]
    await again.close("9" * 64)
    assert list((tmp_path / "gateway").iterdir()) == []  # nothing left after the teardown
    await again.stop()


async def test_a_gone_sandbox_is_forgotten_on_reopen(
    tmp_path: Path, fake_openai: FakeOpenAI
) -> None:
    first = NodeGateway(tmp_path, listen=HostLoopback())
    await first.open("8" * 64, 8, spec_for(fake_openai), KEY)
    await first.stop()

    async def gone(sandbox_id: str) -> int:
        raise LookupError(sandbox_id)

    again = NodeGateway(tmp_path, listen=HostLoopback())
    assert await again.reopen(gone) == []
    assert list((tmp_path / "gateway").iterdir()) == []


async def test_the_gateway_forwards_to_its_upstream_path(
    gateway: tuple[NodeGateway, HostLoopback], fake_openai: FakeOpenAI
) -> None:
    gw, loopback = gateway
    await gw.open("7" * 64, 9, spec_for(fake_openai), KEY)
    async with aiohttp.ClientSession() as http:
        url = f"http://127.0.0.1:{loopback.ports[9]}/v1/chat/completions"
        headers = {"Authorization": f"Bearer {KEY}"}
        async with http.post(url, data=b"[1, 2]", headers=headers) as bad:
            assert bad.status == 400  # not a JSON object: refused before the upstream
        models = await client_for(loopback, 9).models.list()
    assert [m.id for m in models.data] == ["fake-1"]
    assert gw.drain("7" * 64) == []  # a GET is passed through, not a call


def test_listening_in_the_hosts_own_namespace_is_refused() -> None:
    with pytest.raises(NetworkError, match="host's network namespace"):
        listen_in_netns(os.getpid(), 0)


def test_tool_call_deltas_are_merged_by_index() -> None:
    assembly = StreamAssembly()
    deltas = [
        {"index": 0, "id": "call_1", "function": {"name": "bash", "arguments": '{"cmd"'}},
        {"index": 0, "function": {"arguments": ': "ls"}'}},
    ]
    for delta in deltas:
        chunk = {
            "id": "x",
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {"tool_calls": [delta]}}],
        }
        assembly.feed(chunk)
    [choice] = assembly.result()["choices"]
    [call] = choice["message"]["tool_calls"]
    assert call["id"] == "call_1" and call["function"] == {
        "name": "bash",
        "arguments": '{"cmd": "ls"}',
    }
