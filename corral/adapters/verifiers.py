"""Corral as a verifiers environment: each rollout's tool calls run in a Corral episode.

    env = CorralSandboxEnv(spec={"image": "busybox", "reward": "..."}, dataset=dataset)
    results = await env.evaluate(client, model, num_examples=8, rollouts_per_example=4)
    results["reward"]          # the episodes' reward commands' numbers

A verifiers `StatefulToolEnv` (the classic `vf.Environment` API, shaped like its
own `SandboxEnv`): `setup_state` starts an interactive episode per rollout, the
model gets `bash`, `read_file` and `write_file` tools that act in the sandbox,
and the rollout's cleanup finishes the episode, so its reward command scores
what the sandbox holds; the rubric's `corral_reward` is that number. A dataset
row may carry its own spec in `info["corral_spec"]` (else the env's `spec`).
"""

from __future__ import annotations

import contextlib
from typing import Any

from corral.adapters._frameworks import require

require("verifiers", "verifiers")

import verifiers as vf  # noqa: E402

from contract.config import StackConfig  # noqa: E402
from contract.models import EpisodeSpec  # noqa: E402
from corral.adapters._episodes import end_episode, interactive_spec, reward_of  # noqa: E402
from corral.env import observe  # noqa: E402
from corral.errors import (  # noqa: E402
    CorralError,
    EpisodeRejected,
    EpisodeRequestFailed,
    InvalidEpisodeSpec,
)
from corral.sdk import Corral, Episode  # noqa: E402

__all__ = ["CorralSandboxEnv", "corral_reward"]

HIDDEN_ARGS = ["episode_id"]  # set by the env for each rollout, never by the model


async def corral_reward(state: vf.State) -> float:
    """The episode's reward command's number (0 unless the episode completed)."""
    return float(state.get("corral_reward", 0.0))


class CorralSandboxEnv(vf.StatefulToolEnv):
    """One Corral episode per rollout; its reward command is the rubric."""

    def __init__(
        self,
        spec: EpisodeSpec | dict[str, Any] | None = None,
        *,
        corral: Corral | None = None,
        stack_config: StackConfig | None = None,
        command_timeout_s: float | None = 60.0,
        max_turns: int = 10,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("rubric", vf.Rubric(funcs=[corral_reward]))
        # An episode that stopped taking requests (a rule killed it, it timed out or
        # is quarantined) ends the rollout; other tool errors go back to the model.
        kwargs.setdefault("stop_errors", [EpisodeRejected])
        super().__init__(max_turns=max_turns, **kwargs)
        self.spec = interactive_spec(spec) if spec is not None else None
        self.command_timeout_s = command_timeout_s
        self._corral = corral
        self._stack_config = stack_config
        for tool in (self.bash, self.read_file, self.write_file):
            self.add_tool(tool, args_to_skip=HIDDEN_ARGS)

    async def setup_state(self, state: vf.State, **kwargs: Any) -> vf.State:
        """Start this rollout's episode."""
        corral = await self._connected()
        try:
            episode = await corral.start_episode(self._spec_for(state))
        except CorralError as err:  # verifiers records it as the rollout's error
            raise vf.SandboxError(f"corral episode not started: {err}") from err
        state["corral_episode_id"] = episode.id
        return await super().setup_state(state, **kwargs) or state

    async def _connected(self) -> Corral:
        # Connected on first use, on the event loop verifiers runs rollouts in.
        if self._corral is None:
            self._corral = await Corral.connect(self._stack_config)
        return self._corral

    def _spec_for(self, state: vf.State) -> EpisodeSpec:
        info = state.get("info") or {}
        own = info.get("corral_spec") if isinstance(info, dict) else None
        if own is not None:
            return interactive_spec(own)
        if self.spec is None:
            raise InvalidEpisodeSpec("no episode spec: pass spec=... or info['corral_spec']")
        return self.spec

    def update_tool_args(
        self,
        tool_name: str,
        tool_args: dict[str, Any],
        messages: vf.Messages,
        state: vf.State,
        **kwargs: Any,
    ) -> dict[str, Any]:
        return {**tool_args, "episode_id": state["corral_episode_id"]}

    def _episode(self, episode_id: str) -> Episode:
        assert self._corral is not None  # connected in setup_state
        return self._corral.episode(episode_id)

    async def bash(self, command: str, episode_id: str) -> str:
        """Run a shell command in the sandbox; returns its output (and exit code if not 0)."""
        step = await self._episode(episode_id).exec(command, timeout_s=self.command_timeout_s)
        return observe(step) or "(no output)"

    async def read_file(self, path: str, episode_id: str) -> str:
        """Read a text file in the sandbox."""
        try:
            data = await self._episode(episode_id).read_file(path)
        except EpisodeRequestFailed as err:
            return f"error: {err}"
        return data.decode(errors="replace")

    async def write_file(self, path: str, content: str, episode_id: str) -> str:
        """Write a text file in the sandbox (parent directories are made)."""
        await self._episode(episode_id).write_file(path, content)
        return f"wrote {len(content.encode())} bytes to {path}"

    @vf.cleanup
    async def finish_episode(self, state: vf.State) -> None:
        """Finish the rollout's episode: its reward command scores the sandbox."""
        episode_id = state.get("corral_episode_id")
        if episode_id is None or "corral_result" in state:
            return
        episode = self._episode(episode_id)
        if state.get("error") is not None:  # a broken rollout: free the sandbox, no reward
            with contextlib.suppress(CorralError):
                await episode.cancel()
            state["corral_reward"] = 0.0
            state["corral_result"] = None
            return
        result = await end_episode(episode)
        state["corral_result"] = result.model_dump(mode="json")
        state["corral_reward"] = reward_of(result)
