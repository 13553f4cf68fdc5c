"""The model gateway end to end: the real `openai` client inside a sandbox with no
network reaches the node's gateway on its loopback, the calls reach a local
OpenAI-compatible server, and each call, with its tokens, is in the step's
result, the rollout and `corral export`.

The sandbox image is Debian bookworm's python3 (debootstrap, cached in
CORRAL_CACHE_DIR like tests/integration/sandbox/test_debian_image.py) plus a
layer holding the `openai` package at the host's version (pip --target, cached).
The session stack runs without a warm pool (tests/integration/conftest.py says
why); the warm path is the detection suite's (tests/integration/detection/
test_model_gateway_warm.py), with the pool on and the sensor watching.
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime

import pytest

from contract.models import ModelCall
from corral import Corral
from corral.env import CorralEnv, Task
from corral.errors import InvalidEpisodeSpec
from corral.export import export_trajectories
from tests.fake_openai import FakeOpenAI
from tests.integration.conftest import PYLIB, PYTHON_IMAGE, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(900),
    pytest.mark.skipif(not shutil.which("debootstrap"), reason="needs debootstrap"),
]

AGENT = """\
import sys, urllib.request
import openai
client = openai.OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY: the episode's gateway
reply = client.chat.completions.create(
    model="fake-1", messages=[{"role": "user", "content": "fix the bug"}],
    logprobs=True, extra_body={"return_token_ids": True})
print(reply.choices[0].message.content)
stream = client.chat.completions.create(
    model="fake-1", messages=[{"role": "user", "content": "stream it"}], stream=True)
print("".join(chunk.choices[0].delta.content or "" for chunk in stream))
try:
    client.completions.create(model="fake-1", prompt="one more")
except openai.RateLimitError as err:
    print("refused", err.status_code)
try:  # the trainer's server itself is out of reach: the sandbox has no network
    urllib.request.urlopen(sys.argv[1], timeout=3)
    print("upstream reached")
except OSError as err:
    print("upstream unreachable")
"""


def spec(upstream: str, **more: object) -> dict[str, object]:
    return {
        "image": PYTHON_IMAGE,
        "env": {"PYTHONPATH": PYLIB},
        "files": [{"path": "/agent.py", "content": AGENT}],
        "resources": {"memory_mb": 512},
        "model_gateway": {"upstream": upstream, "max_calls": 2},
        **more,
    }


def url(fake: FakeOpenAI) -> str:
    return f"http://127.0.0.1:{fake.port}/v1"


def check_calls(calls: list[ModelCall]) -> None:
    """Two forwarded calls with their tokens, then the refusal past max_calls."""
    first, streamed, refused = calls
    assert (first.status, first.stream, first.completion_tokens) == (200, False, 4)
    assert first.completion_token_ids == [1000, 1001, 1002, 1003]
    assert first.logprobs == [-0.5] * 4 and first.prompt_tokens > 0
    assert json.loads(first.request_json)["messages"][0]["content"] == "fix the bug"
    assert (streamed.status, streamed.stream, streamed.completion_tokens) == (200, True, 3)
    reply = json.loads(streamed.response_json)["choices"][0]["message"]["content"]
    assert reply == "echo: stream it"
    assert refused.status == 429 and "max_calls (2)" in refused.error
    assert [c.index for c in calls] == [0, 1, 2]


async def test_the_openai_client_in_a_sandbox_without_network_goes_through_the_gateway(
    corral: Corral, python_image: str, fake_openai: FakeOpenAI
) -> None:
    since = datetime.now(UTC)
    async with await corral.start_episode(spec(url(fake_openai), interactive=True)) as episode:
        step = await episode.exec(f"python3 /agent.py {url(fake_openai)}/models", timeout_s=120)
        assert step.exit_code == 0, step.stderr
        assert step.stdout.splitlines() == [
            "echo: fix the bug",
            "echo: stream it",
            "refused 429",
            "upstream unreachable",
        ]
        check_calls(step.model_calls)
        # What the agent sent is what the upstream got; the key stayed on the node.
        assert [r["messages"][0]["content"] for r in fake_openai.requests] == [
            "fix the bug",
            "stream it",
        ]
        result = await episode.finish()
    assert result.steps[-1].model_calls == step.model_calls

    rows: list[object] = []

    async def exported() -> bool:
        rows[:] = [
            r for r in await export_trajectories(corral, since) if r.episode_id == episode.id
        ]
        return bool(rows)

    await wait_for(exported)
    [row] = rows
    check_calls(row.steps[-1].model_calls)  # type: ignore[attr-defined]


async def test_a_scripted_episode_records_its_calls_on_the_lean_path(
    corral: Corral, python_image: str, fake_openai: FakeOpenAI
) -> None:
    steps = [f"python3 /agent.py {url(fake_openai)}/models"]
    result = await corral.run_episode(spec(url(fake_openai), steps=steps))
    assert result.outcome == "completed", result.reason
    check_calls(result.steps[0].model_calls)


async def test_a_rollout_carries_the_agents_model_calls(
    corral: Corral, python_image: str, fake_openai: FakeOpenAI
) -> None:
    task = Task.of("gateway", "Call the model.", spec(url(fake_openai), reward="echo 1"))
    async with CorralEnv(corral, task) as env:
        await env.reset(seed=0)
        _, _, _, _, info = await env.step(
            {"tool": "bash", "command": f"python3 /agent.py {url(fake_openai)}/models"}
        )
        check_calls(info["model_calls"])
        await env.step({"tool": "submit"})
    rollout = env.rollout()
    assert rollout.reward == 1.0
    check_calls(rollout.model_calls)
    assert sum(c.total_tokens for c in rollout.model_calls) > 0


async def test_a_bad_gateway_spec_fails_at_start(corral: Corral) -> None:
    with pytest.raises(InvalidEpisodeSpec, match="upstream"):
        await corral.start_episode({"image": "busybox", "model_gateway": {"upstream": "ftp:x"}})
