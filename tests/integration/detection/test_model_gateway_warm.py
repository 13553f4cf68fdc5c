"""The model gateway on the paths users get: warm pool on, sensor watching.

A busybox episode claims a pool sandbox (on the lean path when scripted,
step by step when interactive), its `wget` posts a chat completion to the
gateway on its loopback, and the call is in the step's result. The sensor
sees the connection to loopback and raises nothing: the gateway is not a way
out. The python client's run (cold, a Debian image) is
tests/integration/trainer/test_model_gateway_sandbox.py.
"""

from __future__ import annotations

import pytest

from contract.ids import sandbox_id_for
from contract.models import StepResult
from corral.sdk import Corral
from tests.fake_openai import FakeOpenAI

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CALL = (
    'wget -q -O - --header "Authorization: Bearer $OPENAI_API_KEY" '
    '--header "Content-Type: application/json" '
    """--post-data '{"model": "fake-1", "messages": [{"role": "user", "content": "hi"}]}' """
    '"$OPENAI_BASE_URL/chat/completions"'
)


def gateway_spec(fake: FakeOpenAI, **more: object) -> dict[str, object]:
    upstream = f"http://127.0.0.1:{fake.port}/v1"
    return {"image": "busybox", "model_gateway": {"upstream": upstream}, **more}


def assert_one_call(step: StepResult) -> None:
    assert step.exit_code == 0, step.stderr
    assert '"content": "echo: hi"' in step.stdout
    [call] = step.model_calls
    assert (call.endpoint, call.status, call.completion_tokens) == ("chat/completions", 200, 2)
    assert step.sensor == "ok"


async def test_a_warm_lean_episode_calls_the_model(
    warm_corral: Corral, fake_openai: FakeOpenAI
) -> None:
    episode = await warm_corral.start_episode(gateway_spec(fake_openai, steps=[CALL]))
    result = await episode.result()
    assert result.outcome == "completed", result.reason
    assert result.sandbox_id != sandbox_id_for(episode.id), "expected a warm pool sandbox"
    assert_one_call(result.steps[0])
    assert result.alerts == []


async def test_a_warm_interactive_episode_calls_the_model(
    warm_corral: Corral, fake_openai: FakeOpenAI
) -> None:
    async with await warm_corral.start_episode(gateway_spec(fake_openai)) as episode:
        assert_one_call(await episode.exec(CALL))
        assert_one_call(await episode.exec(CALL))
        result = await episode.finish()
    assert result.sandbox_id != sandbox_id_for(episode.id), "expected a warm pool sandbox"
    assert [s.model_calls[0].index for s in result.steps] == [0, 1]
    assert result.alerts == [] and len(fake_openai.requests) == 2
