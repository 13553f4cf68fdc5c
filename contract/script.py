"""How a scripted episode's steps run: the one rule the step-by-step workflow,
the node's lean run and the tests' fake node all follow.

- The steps run in order and stop at the first one that does not end `ok`.
- A step cut off with its sandbox, containerd or node (`interrupted`) runs once
  more, as a new step, when the spec says its steps are idempotent; never
  otherwise (it may have run).
- The reward runs only when the last step ran `ok` (or there were none).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from contract.models import Step, StepResult

RunStep = Callable[[Step, int], Awaitable[StepResult]]  # (step, index) -> its result


def runs_again(result: StepResult, idempotent_steps: bool) -> bool:
    """Whether a scripted step's result calls for running it once more."""
    return bool(result.interrupted) and idempotent_steps


async def run_steps(
    steps: Sequence[Step], *, first_index: int, idempotent_steps: bool, run: RunStep
) -> list[StepResult]:
    """Every result, in order (an interrupted step and its second run both count,
    each at an index of its own), up to and including the first not `ok`."""
    results: list[StepResult] = []
    index = first_index
    for step in steps:
        result = await run(step, index)
        index += 1
        if runs_again(result, idempotent_steps):
            results.append(result)
            result = await run(step, index)
            index += 1
        results.append(result)
        if not result.ok:
            break
    return results


def reward_due(results: Sequence[StepResult]) -> bool:
    """The reward runs when the script did not stop on a failed step."""
    return all(result.ok for result in results[-1:])
