"""Corral episodes as RL environments, in the Gymnasium shape trainers already use.

    env = CorralEnv(corral, tasks)
    observation, info = await env.reset(seed=0)
    while True:
        action = policy(observation)           # "ls", ["cat", "f"], or a tool call
        observation, reward, terminated, truncated, info = await env.step(action)
        if terminated or truncated:
            break

An action is a command (a string runs under /bin/sh -c, a list is an argv) or
a tool call: `{"tool": "bash", "command": ...}`, `{"tool": "write_file",
"path": ..., "content": ...}`, `{"tool": "read_file", "path": ...}`,
`{"tool": "submit"}` (optionally with an `"answer"`, written to
`/workspace/answer` first). Submitting, or reaching `max_steps` (truncation),
finishes the episode: its reward command runs and its number is the reward.
A tool call that fails in the sandbox (a missing file) is an observation, not
an exception: the policy made the mistake, the trainer's loop goes on.

`SyncCorralEnv` is the same environment for synchronous loops; `run_group`
runs G rollouts of one task for GRPO-style group baselines.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import random
import threading
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from contract.config import StackConfig
from contract.models import EpisodeResult, EpisodeSpec, ModelCall, StepResult
from corral.errors import (
    CorralError,
    EpisodeEnded,
    EpisodeError,
    EpisodeQuarantined,
    EpisodeRequestFailed,
    InvalidEpisodeSpec,
)
from corral.sdk import Corral, Episode, parse_spec

__all__ = [
    "Action",
    "CorralEnv",
    "Info",
    "Policy",
    "Rollout",
    "SyncCorralEnv",
    "Task",
    "Transition",
    "reward_of",
    "run_group",
]

Action = str | list[str] | dict[str, Any]
Info = dict[str, Any]
StepReturn = tuple[str, float, bool, bool, Info]
# A policy sees the last observation and info and answers an action (maybe async).
Policy = Callable[[str, Info], Action | Awaitable[Action]]
T = TypeVar("T")

ANSWER_PATH = "/workspace/answer"
TOOLS = ("bash", "write_file", "read_file", "submit")


@dataclass(frozen=True)
class Task:
    """One task: what the policy is told, and the episode that checks its work.

    The spec's `reward` command prints the reward (its last line, a number);
    without a number, a reward command that exits 0 scores 1.0, else 0.0.
    """

    name: str
    prompt: str
    spec: EpisodeSpec

    @classmethod
    def of(cls, name: str, prompt: str, spec: EpisodeSpec | dict[str, Any]) -> Task:
        parsed = parse_spec(spec)
        if parsed.reward is None:
            raise InvalidEpisodeSpec(f"task {name!r}: its spec has no reward command")
        # The policy drives the episode, so it waits for requests after its steps;
        # the label names the task in the Web UI and in `corral export`.
        update = {"interactive": True, "labels": {"task": name, **parsed.labels}}
        return cls(name, prompt, parsed.model_copy(update=update))


@dataclass(frozen=True)
class Transition:
    """One step of a trajectory, as exported for training pipelines."""

    action: Action
    observation: str
    exit_code: int | None
    duration_s: float
    reward: float = 0.0
    # The agent's own model calls while the step ran (`model_gateway:` in the spec).
    model_calls: tuple[ModelCall, ...] = ()


@dataclass
class Rollout:
    task: str
    episode_id: str
    reward: float
    outcome: str
    transitions: list[Transition] = field(default_factory=list)

    @property
    def model_calls(self) -> list[ModelCall]:
        """Every model call of the episode, in order (docs/trainers.md, "Model calls")."""
        return [call for t in self.transitions for call in t.model_calls]


def reward_of(result: EpisodeResult) -> float:
    """The reward command's number; its exit status when it prints none; 0 unless completed."""
    step = result.reward
    if result.outcome != "completed" or step is None:
        return 0.0
    lines = step.stdout.strip().splitlines()
    try:
        return float(lines[-1])
    except (IndexError, ValueError):
        return 1.0 if step.ok else 0.0


class CorralEnv:
    """An async Gymnasium-style environment: one episode per `reset`.

    `tasks` is the suite `reset` draws from (seeded), unless `options={"task":
    name}` picks one. `close()` (or leaving `async with`) cancels a running episode.
    """

    def __init__(
        self,
        corral: Corral,
        tasks: Task | Sequence[Task],
        *,
        max_steps: int = 16,
        step_timeout_s: float | None = None,
    ) -> None:
        self.tasks = [tasks] if isinstance(tasks, Task) else list(tasks)
        if not self.tasks:
            raise InvalidEpisodeSpec("an environment needs at least one task")
        if max_steps < 1:
            raise InvalidEpisodeSpec(f"max_steps must be at least 1, not {max_steps}")
        self.corral = corral
        self.max_steps = max_steps
        self.step_timeout_s = step_timeout_s
        self.episode: Episode | None = None
        self.task: Task | None = None
        self.transitions: list[Transition] = []
        self.result: EpisodeResult | None = None
        self._rng = random.Random()

    async def __aenter__(self) -> CorralEnv:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, Info]:
        """End any running episode, start one of a task; returns (prompt, info)."""
        await self.close()
        if seed is not None:
            self._rng.seed(seed)
        task = self._pick(options or {})
        return self.attach(await self.corral.start_episode(task.spec), task)

    def attach(self, episode: Episode, task: Task) -> tuple[str, Info]:
        """Play `task` in an episode started elsewhere (a fork); returns (prompt, info)."""
        self.task, self.episode = task, episode
        self.transitions, self.result = [], None
        return task.prompt, {"task": task.name, "episode_id": episode.id}

    def _pick(self, options: dict[str, Any]) -> Task:
        name = options.get("task")
        if name is None:
            return self._rng.choice(self.tasks)
        for task in self.tasks:
            if task.name == name:
                return task
        raise InvalidEpisodeSpec(
            f"no task {name!r} (tasks: {', '.join(t.name for t in self.tasks)})"
        )

    async def step(self, action: Action) -> StepReturn:
        """Apply one action; returns (observation, reward, terminated, truncated, info)."""
        episode = self._running()
        observation, reward, terminated, truncated, info = await self._step(episode, action)
        assert self.task is not None  # set with the episode
        base = {"task": self.task.name, "episode_id": episode.id, "step": len(self.transitions)}
        return observation, reward, terminated, truncated, {**base, **info}

    async def _step(self, episode: Episode, action: Action) -> StepReturn:
        tool, args = parse_action(action)
        try:
            if tool == "submit":
                return await self._submit(episode, action, args.get("answer"))
            observation, info = await self._apply(episode, tool, args)
        except EpisodeEnded as err:  # a rule killed it, or a timeout ended it
            return await self._ended(action, str(err))
        except EpisodeQuarantined as err:
            # Left as it is for on-call (its filesystem is the evidence): no reward.
            self.result = EpisodeResult(episode_id=episode.id, outcome="quarantined")
            return self._closing(action, f"episode quarantined: {err}", {})
        if len(self.transitions) + 1 >= self.max_steps:
            observation, reward, _, _, info = await self._finish(action, observation, info)
            return observation, reward, False, True, info
        self.transitions.append(_transition(action, observation, info))
        return observation, 0.0, False, False, info

    def _running(self) -> Episode:
        if self.episode is None or self.result is not None:
            raise EpisodeEnded(
                self.episode.id if self.episode else "-", "ended", "call reset() first"
            )
        return self.episode

    async def _apply(self, episode: Episode, tool: str, args: dict[str, Any]) -> tuple[str, Info]:
        try:
            if tool == "bash":
                step = await episode.exec(args["command"], timeout_s=self.step_timeout_s)
                return observe(step), step_info(step)
            if tool == "write_file":
                await episode.write_file(args["path"], args["content"])
                return f"wrote {len(args['content'])} bytes to {args['path']}", {}
            data = await episode.read_file(args["path"])
            return data.decode(errors="replace"), {}
        except EpisodeRequestFailed as err:
            return f"error: {err}", {"error": err.error_type or type(err).__name__}

    async def _submit(self, episode: Episode, action: Action, answer: Any) -> StepReturn:
        if answer is not None:
            await episode.write_file(ANSWER_PATH, str(answer))
        observation, reward, _, _, info = await self._finish(action, "submitted", {})
        return observation, reward, True, False, info

    async def _finish(self, action: Action, observation: str, info: Info) -> StepReturn:
        try:
            self.result = await self._running().finish()
        except EpisodeEnded as err:
            return await self._ended(action, str(err))
        except EpisodeError as err:
            self.result = err.result
        return self._closing(action, observation, info)

    async def _ended(self, action: Action, why: str) -> StepReturn:
        """The episode ended under the policy (killed, timed out): no reward."""
        episode = self._running()
        try:
            self.result = await episode.result()
        except EpisodeError as err:
            self.result = err.result
        return self._closing(action, f"episode ended: {why}", {})

    def _closing(self, action: Action, observation: str, info: Info) -> StepReturn:
        result = self.result
        reward = reward_of(result) if result is not None else 0.0
        outcome = result.outcome if result is not None else "failed"
        # Mark ended even when the error carried no result, so step() refuses.
        self.result = result or EpisodeResult(
            episode_id=self.episode.id if self.episode else "", outcome="failed"
        )
        self.transitions.append(_transition(action, observation, info, reward))
        return observation, reward, True, False, {**info, "outcome": outcome}

    async def close(self) -> None:
        """Cancel the current episode if it still runs (its sandbox goes at once)."""
        if self.episode is not None and self.result is None:
            with contextlib.suppress(CorralError):  # it may have ended meanwhile
                await self.episode.cancel()
            self.result = EpisodeResult(episode_id=self.episode.id, outcome="cancelled")

    def rollout(self) -> Rollout:
        """The finished episode as a `Rollout` (its transitions and reward)."""
        if self.task is None or self.episode is None or self.result is None:
            raise EpisodeEnded("-", "unknown", "no episode has finished in this environment")
        return Rollout(
            task=self.task.name,
            episode_id=self.episode.id,
            reward=reward_of(self.result),
            outcome=self.result.outcome,
            transitions=list(self.transitions),
        )


def _transition(action: Action, observation: str, info: Info, reward: float = 0.0) -> Transition:
    return Transition(
        action,
        observation,
        info.get("exit_code"),
        info.get("duration_s", 0.0),
        reward,
        tuple(info.get("model_calls", ())),
    )


def parse_action(action: Action) -> tuple[str, dict[str, Any]]:
    """(tool, arguments) of an action; a clear error names what is wrong with it."""
    if isinstance(action, str | list):
        return "bash", {"command": action}
    if not isinstance(action, dict):
        raise InvalidEpisodeSpec(f"an action is a command or a tool call, not {action!r}")
    tool = action.get("tool")
    if tool not in TOOLS:
        raise InvalidEpisodeSpec(f"unknown tool {tool!r} (tools: {', '.join(TOOLS)})")
    needed = {"bash": ("command",), "write_file": ("path", "content"), "read_file": ("path",)}
    missing = [name for name in needed.get(tool, ()) if name not in action]
    if missing:
        raise InvalidEpisodeSpec(f"tool {tool!r} needs {', '.join(missing)}")
    return tool, {k: v for k, v in action.items() if k != "tool"}


def observe(step: StepResult) -> str:
    """What the policy sees of a command: its output, then how it ended if badly."""
    text = step.stdout + (step.stderr if step.stderr else "")
    if step.timed_out:
        return text + f"\n[timed out after {step.duration_s:.1f} s]"
    return text if step.exit_code == 0 else text + f"\n[exit code {step.exit_code}]"


def step_info(step: StepResult) -> Info:
    info: Info = {
        "exit_code": step.exit_code,
        "timed_out": step.timed_out,
        "duration_s": step.duration_s,
        "truncated_output": step.truncated,
    }
    if step.model_calls:
        info["model_calls"] = step.model_calls
    return info


async def run_group(
    corral: Corral,
    task: Task,
    policy: Policy,
    *,
    size: int = 4,
    max_steps: int = 16,
    prefix: Sequence[Action] = (),
    fork: bool = True,
) -> list[Rollout]:
    """G rollouts of one task, run at once, with their rewards (for group baselines).

    With `fork` (the default) one episode sets the task up, plays the shared
    `prefix` actions, and the G rollouts fork from its filesystem at that
    point; without, each rollout is its own episode of the task (and plays
    the prefix itself). `policy` is called with the rollout's index in
    `info["rollout"]` so a stochastic policy can draw each one differently.
    """
    if size < 1:
        raise InvalidEpisodeSpec(f"a group needs at least one rollout, not {size}")
    if len(prefix) >= max_steps:
        raise InvalidEpisodeSpec(f"a prefix of {len(prefix)} actions leaves none of {max_steps}")
    shared: list[Transition] = []
    episodes: list[Episode | None] = [None] * size
    if fork:
        episodes[:], shared = await _forked(corral, task, prefix, size, max_steps)

    async def one(index: int) -> Rollout:
        async with CorralEnv(corral, task, max_steps=max_steps) as env:
            child = episodes[index]
            observation, info = env.attach(child, task) if child else await env.reset()
            env.transitions = list(shared)
            for action in () if child else prefix:
                observation, *_, info = await env.step(action)
            return await _play(env, policy, observation, {**info, "rollout": index})

    return list(await asyncio.gather(*(one(i) for i in range(size))))


async def _forked(
    corral: Corral, task: Task, prefix: Sequence[Action], size: int, max_steps: int
) -> tuple[list[Episode | None], list[Transition]]:
    """`size` episodes forked from one that played `prefix`, and the prefix's transitions."""
    async with CorralEnv(corral, task, max_steps=max_steps) as parent:
        await parent.reset()
        for action in prefix:
            await parent.step(action)
        assert parent.episode is not None  # reset started it
        children: list[Episode | None] = list(await parent.episode.fork(size))
        return children, list(parent.transitions)


async def _play(env: CorralEnv, policy: Policy, observation: str, info: Info) -> Rollout:
    terminated = truncated = False
    while not (terminated or truncated):
        action = await _call(policy, observation, info)
        observation, _, terminated, truncated, step_info = await env.step(action)
        info = {**step_info, "rollout": info["rollout"]}
    return env.rollout()


async def _call(policy: Policy, observation: str, info: Info) -> Action:
    action = policy(observation, info)
    return await action if inspect.isawaitable(action) else action


class SyncCorralEnv:
    """`CorralEnv` for synchronous loops: its own event loop on a private thread.

    Connects with the stack's config (`temporal-dev.yaml` + env) unless given one;
    `close()` ends the episode and the thread.
    """

    def __init__(
        self,
        tasks: Task | Sequence[Task],
        *,
        config: StackConfig | None = None,
        max_steps: int = 16,
        step_timeout_s: float | None = None,
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        try:
            corral = self._run(Corral.connect(config))
            self.env = CorralEnv(corral, tasks, max_steps=max_steps, step_timeout_s=step_timeout_s)
        except BaseException:
            self._stop()
            raise

    def __enter__(self) -> SyncCorralEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, Info]:
        return self._run(self.env.reset(seed=seed, options=options))

    def step(self, action: Action) -> StepReturn:
        return self._run(self.env.step(action))

    def rollout(self) -> Rollout:
        return self.env.rollout()

    def close(self) -> None:
        if self._loop.is_running():
            try:
                self._run(self.env.close())
            finally:
                self._stop()

    def _run(self, work: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(work, self._loop).result()

    def _stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
