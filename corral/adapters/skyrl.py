"""Corral as a skyrl-gym environment: each trajectory of a SkyRL run is a Corral episode.

    from corral.adapters.skyrl import register
    register()                                   # skyrl-gym id "corral"
    env = skyrl_gym.make("corral", env_config={}, extras={"spec": {...}, "max_turns": 8})
    prompt, info = env.init(prompt)              # starts the episode
    out = env.step("<bash>ls /workspace</bash>") # runs it; out["observations"] is the reply
    out = env.step("<answer>42</answer>")        # submits: the reward command scores it
    env.close()

A `BaseTextEnv`: the action is the model's text. `<bash>cmd</bash>` runs a
command, `<answer>x</answer>` writes x to /workspace/answer and submits,
`<submit/>` submits as is. The episode's reward is the step's reward; the last
turn (`max_turns`) submits too. The dataset row's `extras` carry the episode
spec (`spec`, with a `reward` command) and optionally `name` and `max_turns`;
`env_config` may name the stack's config file (`config_path`). Calls go
through the process's shared `SyncCorral`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from corral.adapters._frameworks import require

require("skyrl_gym", "skyrl")

import skyrl_gym  # noqa: E402
from skyrl_gym.envs.base_text_env import (  # noqa: E402
    BaseTextEnv,
    BaseTextEnvStepOutput,
    ConversationType,
)

from contract.config import StackConfig, load_config  # noqa: E402
from corral.adapters._sync import shared  # noqa: E402
from corral.env import Action, CorralEnv, Info, Task  # noqa: E402
from corral.errors import InvalidEpisodeSpec  # noqa: E402

__all__ = ["ENV_ID", "CorralTextEnv", "parse_text_action", "register"]

ENV_ID = "corral"
NO_ACTION = (
    "No action found: wrap a command in <bash>...</bash>, "
    "or the answer in <answer>...</answer>, or say <submit/>."
)
_BASH = re.compile(r"<bash>(.*?)</bash>", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_SUBMIT = re.compile(r"<submit\s*/>|<submit>\s*</submit>")
_PATTERNS = (("bash", _BASH), ("answer", _ANSWER), ("submit", _SUBMIT))


def register(env_id: str = ENV_ID) -> None:
    """Make `skyrl_gym.make(env_id, ...)` build a `CorralTextEnv` (idempotent)."""
    if env_id not in skyrl_gym.registry:
        skyrl_gym.register(id=env_id, entry_point=f"{__name__}:CorralTextEnv")


def parse_text_action(text: str) -> Action | None:
    """The first tag in the model's text as a `corral.env` action; None if it has none."""
    found = [(m.start(), kind, m) for kind, pattern in _PATTERNS if (m := pattern.search(text))]
    if not found:
        return None
    _, kind, match = min(found, key=lambda item: item[0])
    if kind == "bash":
        return {"tool": "bash", "command": match.group(1).strip()}
    if kind == "answer":
        return {"tool": "submit", "answer": match.group(1).strip()}
    return {"tool": "submit"}


class CorralTextEnv(BaseTextEnv):
    """One Corral episode per trajectory, in skyrl-gym's text-in, text-out contract."""

    def __init__(self, env_config: Mapping[str, Any] | None = None, extras: Any = None) -> None:
        super().__init__()
        extras = dict(extras or {})
        config = env_config or {}
        self.max_turns = int(extras.get("max_turns", config.get("max_turns", 8)))
        self.task = _task(extras)
        self.client = shared(_stack_config(config))
        self.env = CorralEnv(self.client.corral, self.task, max_steps=self.max_turns)
        self.reward = 0.0

    def init(self, prompt: ConversationType) -> tuple[ConversationType, dict[str, Any]]:
        """Start the episode; the prompt goes to the model unchanged."""
        _, info = self.client.run(self.env.reset(options={"task": self.task.name}))
        return prompt, info

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        parsed = parse_text_action(action)
        if parsed is None and self.turns < self.max_turns:
            return _step_output(NO_ACTION, 0.0, False, {"error": "no action"})
        observation, reward, terminated, truncated, info = self.client.run(
            self.env.step(parsed or {"tool": "submit"})
        )
        self.reward = reward
        return _step_output(observation, reward, terminated or truncated, info)

    def close(self) -> None:
        """Cancel the episode if the trajectory stopped before it finished."""
        self.client.run(self.env.close())

    def get_metrics(self) -> dict[str, Any]:
        return {"corral_reward": self.reward, "corral_steps": len(self.env.transitions)}


def _step_output(observation: str, reward: float, done: bool, info: Info) -> BaseTextEnvStepOutput:
    """The observation goes back to the model as a user turn, unless the episode is over."""
    messages = [] if done else [{"role": "user", "content": observation}]
    return BaseTextEnvStepOutput(observations=messages, reward=reward, done=done, metadata=info)


def _task(extras: dict[str, Any]) -> Task:
    spec = extras.get("spec")
    if not isinstance(spec, Mapping):
        raise InvalidEpisodeSpec("a corral skyrl-gym row needs extras['spec'], an episode spec")
    name = str(extras.get("name", "corral-task"))
    return Task.of(name, str(extras.get("prompt", "")), dict(spec))


def _stack_config(config: Mapping[str, Any]) -> StackConfig | None:
    given = config.get("stack_config")
    if isinstance(given, StackConfig):
        return given
    path = config.get("config_path")
    return load_config(Path(path)) if path else None
