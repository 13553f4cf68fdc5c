"""skyrl-gym on Corral: SkyRL's text-in, text-out loop, one episode per trajectory.

Run it with the stack up: `.venv/bin/python examples/adapter_skyrl.py` (needs
`corral[skyrl]`). In a SkyRL run, the dataset rows name `env_class: corral` and
carry the episode spec in their extras; its generator calls `init` and `step`
exactly as below, with the policy model's text in place of the script.
"""

from __future__ import annotations

import os

import skyrl_gym

from corral.adapters.skyrl import register

ROW = {
    "name": "count-lines",
    "max_turns": 4,
    "spec": {
        "image": "busybox",
        "files": [{"path": "/workspace/data.txt", "content": "a\nb\nc\n"}],
        "reward": 'test "$(cat /workspace/answer)" = 3 && echo 1 || echo 0',
    },
}
MODEL_TEXTS = ["<bash>wc -l < /workspace/data.txt</bash>", "There are <answer>3</answer>."]


def play() -> tuple[list[dict[str, str]], float]:
    """One trajectory: the conversation and its reward."""
    register()  # skyrl_gym.make("corral", ...) now builds a CorralTextEnv
    env = skyrl_gym.make("corral", env_config={}, extras=ROW)
    chat, _ = env.init([{"role": "user", "content": "How many lines has data.txt?"}])
    reward = 0.0
    try:
        for text in MODEL_TEXTS:
            out = env.step(text)
            chat += [{"role": "assistant", "content": text}, *out["observations"]]
            reward = out["reward"]
            if out["done"]:
                break
    finally:
        env.close()
    return chat, reward


def main() -> None:
    chat, reward = play()
    for message in chat:
        print(f"{message['role']}: {message['content'].strip()}")
    print("reward:", reward)


if __name__ == "__main__":
    main()
    os._exit(0)  # temporalio/sdk-python#300: a client-only process can abort at exit
