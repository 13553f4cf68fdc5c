"""corral.env and examples/rl_loop.py against the real stack."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from contract.config import StackConfig
from corral import Corral
from corral.env import CorralEnv, Rollout, SyncCorralEnv, Task, run_group
from corral.errors import CorralError

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
ANSWER_IS_42 = Task.of(
    "answer",
    "Submit 42.",
    {"image": "busybox", "reward": 'test "$(cat /workspace/answer)" = 42 && echo 1 || echo 0'},
)


def _rl_loop() -> ModuleType:
    spec = importlib.util.spec_from_file_location("rl_loop", REPO / "examples" / "rl_loop.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["rl_loop"] = module  # dataclasses in it look their module up
    spec.loader.exec_module(module)
    return module


async def test_tool_calls_observe_the_sandbox_and_submit_scores(corral: Corral) -> None:
    async with CorralEnv(corral, ANSWER_IS_42) as env:
        prompt, info = await env.reset(seed=1)
        assert prompt == "Submit 42." and info["task"] == "answer"
        observation, reward, terminated, truncated, info = await env.step(
            {"tool": "bash", "command": "echo out; echo err >&2; exit 3"}
        )
        assert (observation, reward, terminated, truncated) == (
            "out\nerr\n\n[exit code 3]",
            0.0,
            False,
            False,
        )
        assert info["exit_code"] == 3 and info["episode_id"] == env.episode.id  # type: ignore[union-attr]
        observation, *_, info = await env.step({"tool": "read_file", "path": "/workspace/none"})
        assert observation.startswith("error: ") and info["error"] == "FileNotFound"
        await env.step({"tool": "write_file", "path": "/workspace/a.txt", "content": "abc"})
        observation, *_ = await env.step({"tool": "read_file", "path": "/workspace/a.txt"})
        assert observation == "abc"
        observation, reward, terminated, truncated, info = await env.step(
            {"tool": "submit", "answer": 42}
        )
        assert (reward, terminated, truncated, info["outcome"]) == (1.0, True, False, "completed")
    rollout = env.rollout()
    assert [t.exit_code for t in rollout.transitions] == [3, None, None, None, None]
    assert rollout.reward == 1.0


async def test_max_steps_truncates_and_still_scores(corral: Corral) -> None:
    async with CorralEnv(corral, ANSWER_IS_42, max_steps=2) as env:
        await env.reset()
        *_, truncated, _ = await env.step("echo 41 > /workspace/answer")
        assert not truncated
        _, reward, terminated, truncated, info = await env.step("echo 42 > /workspace/answer")
        assert (reward, terminated, truncated, info["outcome"]) == (1.0, False, True, "completed")


async def test_the_sync_environment_runs_in_a_plain_loop(stack_config: StackConfig) -> None:
    def play() -> tuple[float, bool]:
        with SyncCorralEnv(ANSWER_IS_42, config=stack_config) as env:
            env.reset()
            env.step({"tool": "bash", "command": "echo 7 > /workspace/answer"})
            _, reward, terminated, _, _ = env.step({"tool": "submit"})
            return reward, terminated

    assert await asyncio.to_thread(play) == (0.0, True)


@pytest.mark.parametrize("fork", [True, False])
async def test_a_group_shares_its_prefix(corral: Corral, fork: bool) -> None:
    def submit(observation: str, info: dict[str, object]) -> dict[str, str]:
        return {"tool": "submit"}

    prefix = ["echo 42 > /workspace/answer"]
    rollouts = await run_group(corral, ANSWER_IS_42, submit, size=3, prefix=prefix, fork=fork)
    assert [r.reward for r in rollouts] == [1.0, 1.0, 1.0]
    assert all(r.transitions[0].action == prefix[0] for r in rollouts)
    assert len({r.episode_id for r in rollouts}) == 3


async def _why(corral: Corral, rollout: Rollout) -> str:
    """How a rollout's episode ended, from its result (for a failure message)."""
    try:
        result = await corral.episode(rollout.episode_id).result(timeout_s=60)
    except CorralError as err:
        return f"{rollout.episode_id}: {err}"
    return f"{rollout.episode_id}: {result.outcome}: {result.reason}"


async def test_rl_loop_example_runs_8_groups_of_4(corral: Corral) -> None:
    rl_loop = _rl_loop()
    groups = await rl_loop.train(corral, groups=8, size=4)
    rollouts = [rollout for group in groups for rollout in group]
    assert [len(group) for group in groups] == [4] * 8
    not_completed = [await _why(corral, r) for r in rollouts if r.outcome != "completed"]
    assert not not_completed, not_completed
    # The plans are a mix of right and wrong answers: both rewards appear.
    assert {r.reward for r in rollouts} == {0.0, 1.0}
    assert len({r.episode_id for r in rollouts}) == 32
