"""The janitor reaps the sandbox of a terminated episode (termination runs no code)."""

from __future__ import annotations

import pytest
from episode_helpers import eventually, sandbox_exists

from contract.config import StackConfig
from corral.errors import EpisodeTerminated
from corral.sdk import Corral
from workers.stack import JANITOR_SCHEDULE_ID
from workflows.janitor import JanitorInput, JanitorWorkflow

pytestmark = pytest.mark.integration


async def test_janitor_reaps_a_terminated_episodes_sandbox(
    corral: Corral, stack_config: StackConfig
) -> None:
    episode = await corral.start_episode({"image": "busybox", "interactive": True})
    await episode.exec("true")
    status = await episode.status()
    await corral.client.get_workflow_handle(episode.id).terminate("test: no code runs")
    with pytest.raises(EpisodeTerminated):
        await episode.result()
    assert await sandbox_exists(stack_config, status.sandbox_id)  # nobody tore it down

    reaped = await corral.client.execute_workflow(
        JanitorWorkflow.run,
        JanitorInput(nodes=stack_config.node_names(), grace_s=0),
        id=f"janitor-test-{episode.id}",
        task_queue=stack_config.workers.workflow_task_queue,
    )
    # The minute schedule may have run first; either way the janitor reaped it.
    removed = {sid for r in reaped for sid in r.removed}
    assert {r.node for r in reaped} == set(stack_config.node_names())
    assert status.sandbox_id in removed or not await sandbox_exists(stack_config, status.sandbox_id)
    assert not await sandbox_exists(stack_config, status.sandbox_id)


async def test_janitor_leaves_running_episodes_alone_and_schedule_exists(
    corral: Corral, stack_config: StackConfig
) -> None:
    episode = await corral.start_episode({"image": "busybox", "interactive": True})
    await episode.exec("true")
    sandbox_id = (await episode.status()).sandbox_id

    schedule = corral.client.get_schedule_handle(JANITOR_SCHEDULE_ID)
    await schedule.trigger()  # the stack's schedule, run now (grace 30 s)
    reaped = await corral.client.execute_workflow(
        JanitorWorkflow.run,
        JanitorInput(nodes=stack_config.node_names(), grace_s=0),
        id=f"janitor-test-{episode.id}",
        task_queue=stack_config.workers.workflow_task_queue,
    )
    assert sandbox_id not in {sid for r in reaped for sid in r.removed}
    assert await sandbox_exists(stack_config, sandbox_id)
    assert (await episode.exec("echo still here")).stdout == "still here\n"

    async def triggered() -> bool:
        desc = await schedule.describe()
        return desc.info.num_actions >= 1

    await eventually(triggered, what="schedule ran")
    await episode.finish()
