"""corral.adapters.verifiers: verifiers' own `evaluate` runs rollouts whose tool calls
act in real episodes, the model being a scripted OpenAI-compatible server on loopback."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from datasets import Dataset
from openai import AsyncOpenAI
from verifiers.clients import OpenAIChatCompletionsClient

from corral import Corral
from corral.adapters.verifiers import CorralSandboxEnv

pytestmark = pytest.mark.integration

SPEC = {
    "image": "busybox",
    "files": [{"path": "/workspace/nums.txt", "content": "3\n14\n15\n92\n"}],
    "reward": 'test "$(cat /workspace/answer)" = 124 && echo 1 || echo 0',
}
RIGHT_TASK = "Write the sum of /workspace/nums.txt to /workspace/answer."
WRONG_TASK = "Write the largest number of /workspace/nums.txt to /workspace/answer."
SUM_TO_ANSWER = "awk '{s+=$1} END {print s}' /workspace/nums.txt > /workspace/answer"
# The scripted model: per task, its replies in order (a tool call, or the final text).
SCRIPTS: dict[str, list[tuple[str, dict[str, str]] | str]] = {
    RIGHT_TASK: [
        ("read_file", {"path": "/workspace/nums.txt"}),
        (
            "bash",
            {"command": "awk '{s+=$1} END {print s}' /workspace/nums.txt > /workspace/answer"},
        ),
        "Done.",
    ],
    WRONG_TASK: [
        ("bash", {"command": "sort -n /workspace/nums.txt | tail -n 1"}),
        ("write_file", {"path": "/workspace/answer", "content": "92"}),
        "Done.",
    ],
}


def _reply(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The script's next reply to this conversation: its task, and how far it got."""
    task = next(m["content"] for m in messages if m["role"] == "user")
    turn = sum(m["role"] == "assistant" for m in messages)
    step = SCRIPTS[task][turn]
    if isinstance(step, str):
        return {"role": "assistant", "content": step}
    name, arguments = step
    function = {"name": name, "arguments": json.dumps(arguments)}
    call = {"id": f"call-{turn}", "type": "function", "function": function}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


async def _chat_completions(request: web.Request) -> web.Response:
    body = await request.json()
    message = _reply(body["messages"])
    return web.json_response(
        {
            "id": f"chatcmpl-{time.monotonic_ns()}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if "tool_calls" in message else "stop",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
    )


@pytest_asyncio.fixture
async def scripted_model() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _chat_completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)  # any free port, loopback only
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        await runner.cleanup()


async def test_evaluate_runs_tool_calls_in_episodes_and_scores(
    corral: Corral, scripted_model: str
) -> None:
    dataset = Dataset.from_list(
        [{"question": RIGHT_TASK, "answer": "124"}, {"question": WRONG_TASK, "answer": "124"}]
    )
    env = CorralSandboxEnv(SPEC, corral=corral, eval_dataset=dataset, max_turns=6)
    client = OpenAIChatCompletionsClient(AsyncOpenAI(base_url=scripted_model, api_key="none"))
    results = await env.evaluate(
        client, "scripted", num_examples=2, rollouts_per_example=2, on_progress=lambda *a, **k: None
    )
    outputs = sorted(results["outputs"], key=lambda o: o["example_id"])
    assert [o["reward"] for o in outputs] == [1.0, 1.0, 0.0, 0.0]
    assert all(o["error"] is None and o["is_completed"] for o in outputs)
    # The tools' replies are the sandbox's: the file as written, the command's output.
    right_tools = [m for m in outputs[0]["completion"] if m["role"] == "tool"]
    assert right_tools[0]["content"] == "3\n14\n15\n92\n"
    wrong_tools = [m for m in outputs[2]["completion"] if m["role"] == "tool"]
    assert [m["content"] for m in wrong_tools] == ["92\n", "wrote 2 bytes to /workspace/answer"]
