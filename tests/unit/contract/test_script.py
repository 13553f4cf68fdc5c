"""The scripted-step rule every path follows (contract/script.py)."""

from __future__ import annotations

from collections.abc import Iterator

from contract.models import Step, StepResult
from contract.script import reward_due, run_steps, runs_again


def _result(index: int, cmd: str, exit_code: int = 0, interrupted: str = "") -> StepResult:
    return StepResult(index=index, cmd=cmd, exit_code=exit_code, interrupted=interrupted)


class _Node:
    """Answers each run of a command from a queue of outcomes: 0, 1, or "cut"."""

    def __init__(self, outcomes: dict[str, list[int | str]]) -> None:
        self._outcomes = {cmd: iter(queue) for cmd, queue in outcomes.items()}
        self.ran: list[tuple[str, int]] = []

    async def run(self, step: Step, index: int) -> StepResult:
        cmd = str(step.cmd)
        self.ran.append((cmd, index))
        outcome = next(self._outcomes.get(cmd, _zeros()))
        if outcome == "cut":
            return _result(index, cmd, exit_code=-1, interrupted="containerd gone")
        return _result(index, cmd, exit_code=int(outcome))


def _zeros() -> Iterator[int]:
    while True:
        yield 0


STEPS = [Step(cmd="a"), Step(cmd="b"), Step(cmd="c")]


async def test_the_steps_stop_at_the_first_failure_and_the_reward_is_not_due() -> None:
    node = _Node({"b": [1]})
    results = await run_steps(STEPS, first_index=0, idempotent_steps=False, run=node.run)
    assert node.ran == [("a", 0), ("b", 1)]
    assert [r.ok for r in results] == [True, False]
    assert not reward_due(results)


async def test_an_interrupted_step_runs_again_only_when_the_spec_says_steps_are_idempotent() -> (
    None
):
    node = _Node({"b": ["cut", 0]})
    results = await run_steps(STEPS, first_index=5, idempotent_steps=True, run=node.run)
    assert node.ran == [("a", 5), ("b", 6), ("b", 7), ("c", 8)]  # a new index each run
    assert [r.interrupted != "" for r in results] == [False, True, False, False]
    assert reward_due(results)

    node = _Node({"b": ["cut", 0]})
    results = await run_steps(STEPS, first_index=0, idempotent_steps=False, run=node.run)
    assert node.ran == [("a", 0), ("b", 1)]  # it may have run: never twice
    assert not reward_due(results)


async def test_a_step_cut_off_twice_ends_the_script() -> None:
    node = _Node({"a": ["cut", "cut"]})
    results = await run_steps(STEPS, first_index=0, idempotent_steps=True, run=node.run)
    assert node.ran == [("a", 0), ("a", 1)]
    assert not reward_due(results)


def test_the_reward_is_due_after_no_steps_and_after_all_went_well() -> None:
    assert reward_due([])
    assert reward_due([_result(0, "a"), _result(1, "b")])
    assert not runs_again(_result(0, "a", exit_code=3), idempotent_steps=True)
