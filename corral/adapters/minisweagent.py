"""Corral as a mini-swe-agent environment: the agent's bash actions run in a Corral episode.

    env = CorralEnvironment({"image": "busybox", "reward": "..."}, cwd="/workspace")
    agent = DefaultAgent(model, env, **agent_config)
    agent.run("Fix the bug in /workspace/app.py")   # every action: env.execute(...)
    result = env.finish()                          # the reward runs; an EpisodeResult
    env.reward                                     # its number (corral.env.reward_of)

It follows mini-swe-agent's `Environment` protocol (`execute(action, cwd)`,
`get_template_vars`, `serialize`) and its submission convention: a command
whose output starts with `COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` ends the run
(`Submitted`); so does an episode that ended under the agent (killed by a rule,
timed out: exit status `EpisodeEnded`). mini-swe-agent is synchronous; the
episode's calls go through a `SyncCorral` (one event loop thread and connection
per process, shared).
"""

from __future__ import annotations

import contextlib
from typing import Any

from corral.adapters._frameworks import require

require("minisweagent", "minisweagent")

from minisweagent.exceptions import InterruptAgentFlow, Submitted  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from contract.config import StackConfig  # noqa: E402
from contract.models import EpisodeResult, EpisodeSpec, StepResult  # noqa: E402
from corral.adapters._episodes import end_episode, interactive_spec, reward_of  # noqa: E402
from corral.adapters._sync import SyncCorral, shared  # noqa: E402
from corral.errors import CorralError, EpisodeRejected  # noqa: E402

__all__ = ["CorralEnvironment", "CorralEnvironmentConfig"]

SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


class CorralEnvironmentConfig(BaseModel):
    cwd: str = ""
    """Working directory of each command; empty: the episode's own (`EpisodeSpec.workdir`)."""
    env: dict[str, str] = {}
    """Environment variables set for each command."""
    timeout: int = 30
    """Seconds a command may run (it then returns with returncode -1)."""


class CorralEnvironment:
    """One Corral episode, started now, as mini-swe-agent's environment."""

    def __init__(
        self,
        spec: EpisodeSpec | dict[str, Any],
        *,
        client: SyncCorral | None = None,
        stack_config: StackConfig | None = None,
        **kwargs: Any,
    ) -> None:
        self.config = CorralEnvironmentConfig(**kwargs)
        self.client = client or shared(stack_config)
        self.spec = interactive_spec(spec)
        self.episode = self.client.run(self.client.corral.start_episode(self.spec))
        self.result: EpisodeResult | None = None
        self._platform: dict[str, str] | None = None

    def execute(
        self, action: dict[str, Any], cwd: str = "", *, timeout: int | None = None
    ) -> dict[str, Any]:
        """Run the action's command; raises `Submitted` when it submits."""
        command = action.get("command", "")
        try:
            output = _output(self._exec(command, cwd, timeout or self.config.timeout))
        except EpisodeRejected as err:  # ended under the agent (a rule, a timeout): stop the run
            raise InterruptAgentFlow(_exit_message("EpisodeEnded", str(err))) from err
        except CorralError as err:  # the request failed; the agent may try again
            output = {
                "output": "",
                "returncode": -1,
                "exception_info": f"An error occurred while executing the command: {err}",
                "extra": {"exception_type": type(err).__name__, "exception": str(err)},
            }
        _raise_if_submitted(output)
        return output

    def _exec(self, command: str, cwd: str, timeout: int) -> StepResult:
        # `exec 2>&1`: one stream, interleaved, as the agent would see it in a terminal.
        return self.client.run(
            self.episode.exec(
                ["/bin/sh", "-c", f"exec 2>&1\n{command}"],
                timeout_s=timeout,
                env=self.config.env,
                workdir=cwd or self.config.cwd or None,
            )
        )

    def finish(self) -> EpisodeResult:
        """End the episode: its reward runs. Idempotent."""
        if self.result is None:
            self.result = self.client.run(end_episode(self.episode))
        return self.result

    @property
    def reward(self) -> float:
        return reward_of(self.finish())

    def cleanup(self) -> None:
        """Cancel the episode if it was never finished (its sandbox goes at once)."""
        if self.result is None:
            with contextlib.suppress(CorralError):  # it ended by itself meanwhile
                self.client.run(self.episode.cancel())
            self.result = EpisodeResult(episode_id=self.episode.id, outcome="cancelled")

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        """The config, the sandbox's `uname` (the prompts' {{system}}, {{machine}}, ...)."""
        episode = {"episode_id": self.episode.id}
        return {**self.config.model_dump(), **self._uname(), **episode, **kwargs}

    def _uname(self) -> dict[str, str]:
        if self._platform is None:
            try:
                step = self.client.run(self.episode.exec("uname -s; uname -r; uname -v; uname -m"))
                lines = step.stdout.splitlines() + [""] * 4
            except CorralError:  # the episode ended: the prompts still render, blank
                lines = [""] * 4
            names = ("system", "release", "version", "machine")
            self._platform = dict(zip(names, lines, strict=False))
        return self._platform

    def serialize(self) -> dict[str, Any]:
        return {
            "info": {
                "config": {
                    "environment": self.config.model_dump(mode="json"),
                    "environment_type": f"{type(self).__module__}.{type(self).__name__}",
                    "episode_id": self.episode.id,
                    "spec": self.spec.model_dump(mode="json"),
                }
            }
        }


def _output(step: StepResult) -> dict[str, Any]:
    if step.timed_out:
        return {
            "output": step.stdout,
            "returncode": -1,
            "exception_info": f"The command timed out after {step.duration_s:.0f} s",
        }
    return {"output": step.stdout + step.stderr, "returncode": step.exit_code, "exception_info": ""}


def _raise_if_submitted(output: dict[str, Any]) -> None:
    """mini-swe-agent's convention: the marker on the first line, exit 0, submits the rest."""
    lines = output.get("output", "").lstrip().splitlines(keepends=True)
    if lines and lines[0].strip() == SUBMIT_MARKER and output["returncode"] == 0:
        submission = "".join(lines[1:])
        raise Submitted(_exit_message("Submitted", submission, submission))


def _exit_message(status: str, content: str, submission: str = "") -> dict[str, Any]:
    """mini-swe-agent's last message of a run: role `exit`, how and what it submitted."""
    return {
        "role": "exit",
        "content": content,
        "extra": {"exit_status": status, "submission": submission},
    }
