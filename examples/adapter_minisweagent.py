"""mini-swe-agent on Corral: its DefaultAgent's bash actions run in an episode.

Run it with the stack up: `.venv/bin/python examples/adapter_minisweagent.py`
(needs `corral[minisweagent]`). The model is mini-swe-agent's own
DeterministicModel replaying a script; swap in `LitellmModel(model_name=...)`
for a real one (the full `corral[minisweagent]` extra brings litellm).
"""

from __future__ import annotations

import os

import yaml
from minisweagent import package_dir
from minisweagent.agents.default import DefaultAgent
from minisweagent.models.test_models import DeterministicModel, make_output

from corral.adapters.minisweagent import CorralEnvironment

TASK = {
    "image": "busybox",
    "files": [{"path": "/workspace/nums.txt", "content": "3\n14\n15\n92\n"}],
    "reward": 'test "$(cat /workspace/answer)" = 124 && echo 1 || echo 0',
}
SCRIPT = [
    "cat nums.txt",
    "awk '{s+=$1} END {print s}' nums.txt > answer",
    "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; cat answer",
]


def solve() -> tuple[dict[str, str], float]:
    """The agent's exit info (status, submission) and the episode's reward."""
    model = DeterministicModel(outputs=[make_output(c, [{"command": c}]) for c in SCRIPT])
    config = yaml.safe_load((package_dir / "config" / "default.yaml").read_text())["agent"]
    env = CorralEnvironment(TASK, cwd="/workspace")
    try:
        agent = DefaultAgent(model, env, **{**config, "cost_limit": 0})
        exit_info = agent.run("Write the sum of nums.txt to /workspace/answer.")
        return exit_info, env.reward
    finally:
        env.cleanup()  # cancels the episode if the agent stopped before it finished


def main() -> None:
    exit_info, reward = solve()
    print(exit_info["exit_status"], repr(exit_info["submission"]), "reward:", reward)


if __name__ == "__main__":
    main()
    os._exit(0)  # temporalio/sdk-python#300: a client-only process can abort at exit
