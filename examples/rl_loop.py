"""A toy RL loop on Corral: 8 groups of 4 rollouts, a scripted random policy.

Run it with the stack up: `.venv/bin/python examples/rl_loop.py`. No model is
downloaded: the policy draws one of a few hand-written plans per rollout (some
right, some wrong), so rewards vary within a group the way a sampled LLM
policy's do. A trainer swaps `ScriptedPolicy` for its model and uses the
rewards for its update (here: printed, with the group's advantage).
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics

from corral import Corral
from corral.env import Action, Info, Rollout, Task, run_group

# Each reward command prints 1 when the answer is right, else 0.
TASKS = [
    Task.of(
        "count-lines",
        "How many lines does /workspace/data.txt have? Submit the number.",
        {
            "image": "busybox",
            "files": [{"path": "/workspace/data.txt", "content": "a\nb\nc\nd\ne\nf\ng\n"}],
            "reward": 'test "$(cat /workspace/answer)" = 7 && echo 1 || echo 0',
        },
    ),
    Task.of(
        "sum",
        "Submit the sum of the numbers in /workspace/nums.txt.",
        {
            "image": "busybox",
            "files": [{"path": "/workspace/nums.txt", "content": "3\n14\n15\n92\n"}],
            "reward": 'test "$(cat /workspace/answer)" = 124 && echo 1 || echo 0',
        },
    ),
    Task.of(
        "hello-file",
        "Create /workspace/out/hello.txt containing the word hello, then submit.",
        {
            "image": "busybox",
            "reward": 'test "$(cat /workspace/out/hello.txt)" = hello && echo 1 || echo 0',
        },
    ),
]

# Plans per task: the actions a rollout plays, in order, then submits.
PLANS: dict[str, list[list[Action]]] = {
    "count-lines": [
        [{"tool": "bash", "command": "wc -l < /workspace/data.txt > /workspace/answer"}],
        [{"tool": "read_file", "path": "/workspace/data.txt"}, {"tool": "submit", "answer": 6}],
        [{"tool": "submit", "answer": 7}],
    ],
    "sum": [
        [
            {
                "tool": "bash",
                "command": "awk '{s+=$1} END {print s}' /workspace/nums.txt > /workspace/answer",
            }
        ],
        [{"tool": "bash", "command": "tail -n 1 /workspace/nums.txt > /workspace/answer"}],
        [{"tool": "read_file", "path": "/workspace/sums.txt"}, {"tool": "submit", "answer": 0}],
    ],
    "hello-file": [
        [
            "mkdir -p /workspace/out",
            {"tool": "write_file", "path": "/workspace/out/hello.txt", "content": "hello"},
        ],
        [{"tool": "write_file", "path": "/workspace/out/hello.txt", "content": "hello"}],
        ["echo hello > /workspace/hello.txt"],
    ],
}


class ScriptedPolicy:
    """Draws a plan per rollout, plays it, then submits."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.plans: dict[str, list[Action]] = {}

    def __call__(self, observation: str, info: Info) -> Action:
        episode_id = info["episode_id"]
        if episode_id not in self.plans:
            self.plans[episode_id] = list(self.rng.choice(PLANS[info["task"]]))
        plan = self.plans[episode_id]
        return plan.pop(0) if plan else {"tool": "submit"}


async def train(
    corral: Corral, *, groups: int = 8, size: int = 4, seed: int = 0
) -> list[list[Rollout]]:
    """Run `groups` groups of `size` rollouts; print each group's rewards and advantages."""
    policy = ScriptedPolicy(seed)
    results = []
    for index in range(groups):
        task = TASKS[index % len(TASKS)]
        rollouts = await run_group(corral, task, policy, size=size, max_steps=8)
        rewards = [r.reward for r in rollouts]
        baseline = statistics.fmean(rewards)
        advantages = " ".join(f"{reward - baseline:+.2f}" for reward in rewards)
        print(f"group {index} {task.name:12} rewards {rewards} advantages {advantages}")
        results.append(rollouts)
    return results


async def main() -> None:
    async with await Corral.connect() as corral:
        groups = await train(corral)
    rewards = [rollout.reward for group in groups for rollout in group]
    print(f"mean reward over {len(rewards)} rollouts: {statistics.fmean(rewards):.3f}")


if __name__ == "__main__":
    asyncio.run(main())
    os._exit(0)  # temporalio/sdk-python#300: a client-only process can abort at exit
