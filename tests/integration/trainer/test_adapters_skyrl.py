"""corral.adapters.skyrl: episodes made by skyrl_gym.make and played in SkyRL's
text-in, text-out loop (init, then step until done) by a scripted "model"."""

from __future__ import annotations

import asyncio
import runpy
from pathlib import Path
from typing import Any

import pytest
import skyrl_gym

from contract.config import StackConfig
from corral import Corral
from corral.adapters.skyrl import CorralTextEnv, parse_text_action, register
from corral.errors import InvalidEpisodeSpec

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

ROW = {
    "name": "sum",
    "max_turns": 4,
    "spec": {
        "image": "busybox",
        "files": [{"path": "/workspace/nums.txt", "content": "3\n14\n15\n92\n"}],
        "reward": 'test "$(cat /workspace/answer)" = 124 && echo 1 || echo 0',
    },
}
PROMPT = [{"role": "user", "content": "Submit the sum of /workspace/nums.txt."}]
# Each "model" is the list of texts it answers, turn after turn.
RIGHT = ["Let me look. <bash>cat /workspace/nums.txt</bash>", "It is <answer>124</answer>."]
WRONG = ["I will guess.", "<answer>123</answer>"]
OUT_OF_TURNS = ["<bash>echo 124 > /workspace/answer</bash>"] + ["thinking..."] * 3


def _trajectory(config: StackConfig, texts: list[str]) -> tuple[list[dict[str, Any]], float, int]:
    """SkyRL's agent loop, with the model replaced by the scripted texts."""
    env = skyrl_gym.make("corral", env_config={"stack_config": config}, extras=ROW)
    assert isinstance(env, CorralTextEnv)
    try:
        chat, _ = env.init(list(PROMPT))
        reward, done, turns = 0.0, False, 0
        for text in texts:
            out = env.step(text)
            chat += [{"role": "assistant", "content": text}, *out["observations"]]
            reward, done, turns = out["reward"], out["done"], turns + 1
            if done:
                break
        assert done
        return chat, reward, turns
    finally:
        env.close()


async def test_scripted_trajectories_score_through_skyrl_gym(corral: Corral) -> None:
    stack_config = corral.config  # the running test stack's
    register()

    def rollouts() -> list[tuple[list[dict[str, Any]], float, int]]:
        return [_trajectory(stack_config, texts) for texts in (RIGHT, WRONG, OUT_OF_TURNS)]

    right, wrong, out_of_turns = await asyncio.to_thread(rollouts)
    assert (right[1], right[2]) == (1.0, 2)
    assert right[0][2]["content"] == "3\n14\n15\n92\n"  # the sandbox's file, as the model saw it
    assert (wrong[1], wrong[2]) == (0.0, 2)
    assert "No action found" in wrong[0][2]["content"]
    # The last turn ends the episode and scores what the sandbox holds by then.
    assert (out_of_turns[1], out_of_turns[2]) == (1.0, 4)


def test_actions_parse_and_a_row_without_a_spec_is_refused() -> None:
    assert parse_text_action("x <answer>7</answer> <bash>ls</bash>") == {
        "tool": "submit",
        "answer": "7",
    }
    assert parse_text_action("<submit/>") == {"tool": "submit"}
    assert parse_text_action("nothing") is None
    with pytest.raises(InvalidEpisodeSpec, match="extras\\['spec'\\]"):
        CorralTextEnv({}, {"name": "x"})


async def test_the_example_counts_the_lines(corral: Corral) -> None:
    play = runpy.run_path(str(EXAMPLES / "adapter_skyrl.py"))["play"]
    chat, reward = await asyncio.to_thread(play)  # the stack's config, from the env
    assert (chat[2]["content"].strip(), reward) == ("3", 1.0)
