"""Continue-as-new hands the live sandbox and the step log to the next run.

`EpisodeInput.max_steps_per_run` makes the hand-over happen after a couple of
steps instead of 400, through the real worker and server.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from episode_helpers import sandbox_exists
from temporalio.api.enums.v1 import EventType

from contract.config import StackConfig
from contract.ids import calls_workflow_id, sandbox_id_for
from corral.sdk import Corral, Episode, parse_spec
from workflows.episode import EpisodeWorkflow

pytestmark = pytest.mark.integration

APPEND = "echo {n} >> /tmp/log"


async def _start(corral: Corral, spec: dict[str, Any], per_run: int) -> tuple[Episode, str]:
    episode_id = f"can-{uuid.uuid4().hex[:12]}"
    episode_input = corral._input(parse_spec(spec), None).model_copy(
        update={"max_steps_per_run": per_run}
    )
    handle = await corral.client.start_workflow(
        EpisodeWorkflow.run,
        episode_input,
        id=episode_id,
        task_queue=corral.config.workers.workflow_task_queue,
    )
    assert handle.first_execution_run_id is not None
    return Episode(handle), handle.first_execution_run_id


async def _runs(corral: Corral, episode_id: str, first_run_id: str) -> list[str]:
    """Run ids of the chain, following ContinuedAsNew events from the first run."""
    runs, run_id = [], first_run_id
    while run_id:
        runs.append(run_id)
        history = await corral.client.get_workflow_handle(episode_id, run_id=run_id).fetch_history()
        last = history.events[-1]
        run_id = (
            last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
            if last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
            else ""
        )
    return runs


async def test_scripted_episode_continues_as_new_with_same_sandbox_and_log(
    corral: Corral, stack_config: StackConfig
) -> None:
    spec = {
        "image": "busybox",
        "steps": [APPEND.format(n=n) for n in range(5)],
        "reward": "cat /tmp/log | wc -l",
    }
    episode, first_run = await _start(corral, spec, per_run=2)
    result = await episode.result()

    assert result.outcome == "completed", result.reason
    runs = await _runs(corral, episode.id, first_run)
    assert len(runs) == 3  # steps 0-1, 2-3, then 4 and the reward
    assert [s.index for s in result.steps] == [0, 1, 2, 3, 4, 5]
    assert [s.source for s in result.steps].count("reward") == 1
    # Each step ran exactly once, in order, in one sandbox: the reward counts them.
    assert result.reward is not None and result.reward.stdout.strip() == "5"
    assert result.sandbox_id == sandbox_id_for(episode.id)
    assert not await sandbox_exists(stack_config, result.sandbox_id)


async def test_interactive_episode_continues_as_new_between_requests(
    corral: Corral, stack_config: StackConfig
) -> None:
    spec = {"image": "busybox", "interactive": True, "reward": "cat /tmp/log"}
    episode, first_run = await _start(corral, spec, per_run=2)
    sandboxes = set()
    for n in range(5):
        step = await episode.exec(APPEND.format(n=n))
        assert step.ok and step.index == n
        sandboxes.add((await episode.status()).sandbox_id)
    assert sandboxes == {sandbox_id_for(episode.id)}
    assert await episode.read_file("/tmp/log") == b"0\n1\n2\n3\n4\n"

    logged = await episode.steps()  # the latest run's log still holds every step
    assert [s.index for s in logged] == [0, 1, 2, 3, 4]
    assert [s.cmd for s in logged] == [APPEND.format(n=n) for n in range(5)]

    final = await episode.finish()
    assert final.outcome == "completed"
    assert final.reward is not None and final.reward.stdout == "0\n1\n2\n3\n4\n"
    # The calls ran in the episode's calls workflow (workflows/calls.py), which
    # continues as new at the same limit: every 2 calls, so at least twice for 4 or 5.
    calls_runs = [
        run.run_id
        async for run in corral.client.list_workflows(
            f"WorkflowId = '{calls_workflow_id(episode.id)}'"
        )
    ]
    assert len(await _runs(corral, episode.id, first_run)) + len(calls_runs) >= 3
    assert len(calls_runs) >= 2
    assert not await sandbox_exists(stack_config, final.sandbox_id)
