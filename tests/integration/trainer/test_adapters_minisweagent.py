"""corral.adapters.minisweagent: mini-swe-agent's DefaultAgent, driven by its own
DeterministicModel, runs its actions in real episodes."""

from __future__ import annotations

import asyncio
import contextlib
import runpy
from pathlib import Path
from typing import Any

import pytest
import yaml
from minisweagent import package_dir
from minisweagent.agents.default import DefaultAgent
from minisweagent.models.test_models import DeterministicModel, make_output

from corral import Corral, EpisodeCancelled
from corral.adapters._sync import SyncCorral
from corral.adapters.minisweagent import CorralEnvironment

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

TASK = {
    "image": "busybox",
    "files": [{"path": "/workspace/data.txt", "content": "3\n14\n15\n"}],
    "reward": 'test "$(cat /workspace/answer)" = 32 && echo 1 || echo 0',
}
RIGHT = ["cd /workspace && awk '{s+=$1} END {print s}' data.txt > answer", "cat answer"]
WRONG = ["cd /workspace && tail -n 1 data.txt > answer", "ls /nonexistent"]


# (the agent's exit info, its messages, the episode's reward)
Played = tuple[dict[str, Any], list[dict[str, Any]], float]


def _play(client: SyncCorral, commands: list[str]) -> Played:
    submit = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; cat /workspace/answer"
    script = [*commands, submit]
    outputs = [make_output(f"step {i}", [{"command": c}]) for i, c in enumerate(script)]
    agent_config = yaml.safe_load((package_dir / "config" / "default.yaml").read_text())["agent"]
    env = CorralEnvironment(TASK, client=client, timeout=120)
    try:
        agent = DefaultAgent(
            DeterministicModel(outputs=outputs), env, **{**agent_config, "cost_limit": 0}
        )
        exit_info = agent.run("Write the sum of /workspace/data.txt to /workspace/answer.")
        return exit_info, agent.messages, env.reward
    finally:
        env.cleanup()


async def test_scripted_rollouts_run_in_episodes_and_score(corral: Corral) -> None:
    stack_config = corral.config  # the running test stack's

    def rollouts() -> list[Played]:
        client = SyncCorral(stack_config)
        try:
            return [_play(client, RIGHT), _play(client, WRONG)]
        finally:
            client.close()

    (
        (right, right_messages, right_reward),
        (wrong, wrong_messages, wrong_reward),
    ) = await asyncio.to_thread(rollouts)
    assert (right["exit_status"], right["submission"], right_reward) == ("Submitted", "32\n", 1.0)
    assert (wrong["exit_status"], wrong["submission"], wrong_reward) == ("Submitted", "15\n", 0.0)
    # The agent saw the sandbox's real output, the failed command's status and stderr too.
    right_seen = "\n".join(str(m.get("content")) for m in right_messages)
    assert "<returncode>0</returncode>" in right_seen and "32" in right_seen
    wrong_seen = "\n".join(str(m.get("content")) for m in wrong_messages)
    assert "<returncode>1</returncode>" in wrong_seen and "/nonexistent" in wrong_seen


async def test_the_example_submits_the_sum(corral: Corral) -> None:
    solve = runpy.run_path(str(EXAMPLES / "adapter_minisweagent.py"))["solve"]
    exit_info, reward = await asyncio.to_thread(solve)  # the stack's config, from the env
    assert (exit_info["exit_status"], exit_info["submission"], reward) == (
        "Submitted",
        "124\n",
        1.0,
    )


async def test_an_episode_that_ended_under_the_agent_ends_its_run(corral: Corral) -> None:
    def run_after_the_end() -> tuple[dict[str, Any], str]:
        client = SyncCorral(corral.config)
        try:
            env = CorralEnvironment(TASK, client=client)
            env.get_template_vars()  # a first command: the sandbox is up before the cancel
            client.run(env.episode.cancel())
            with contextlib.suppress(EpisodeCancelled):
                client.run(env.episode.result())  # the episode has ended for sure
            model = DeterministicModel(outputs=[make_output("ls", [{"command": "ls"}])])
            agent = DefaultAgent(model, env, system_template="s", instance_template="t")
            return agent.run("t"), env.finish().outcome
        finally:
            client.close()

    exit_info, outcome = await asyncio.to_thread(run_after_the_end)
    assert (exit_info["exit_status"], outcome) == ("EpisodeEnded", "cancelled")
