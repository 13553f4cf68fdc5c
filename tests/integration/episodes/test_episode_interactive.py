"""Interactive episodes through the SDK: updates, finish, rejections, timeouts,
cancellation, on-call kill, search attributes and placement, on the real stack."""

from __future__ import annotations

import asyncio

import pytest
from episode_helpers import eventually, sandbox_exists, sandboxes_of
from temporalio.client import WorkflowExecutionStatus

from contract.config import StackConfig
from contract.ids import sandbox_id_for
from corral.errors import (
    EpisodeCancelled,
    EpisodeKilled,
    EpisodeRejected,
    EpisodeTimedOut,
)
from corral.sdk import Corral
from workflows.nodes import list_nodes

pytestmark = pytest.mark.integration

INTERACTIVE = {"image": "busybox", "interactive": True}


async def test_exec_write_read_round_trip_and_finish_with_reward(
    corral: Corral, stack_config: StackConfig
) -> None:
    spec = {
        **INTERACTIVE,
        "steps": ["mkdir -p /tmp/work"],
        "reward": "cat /tmp/work/score",
        "env": {"BASE": "b"},
    }
    episode = await corral.start_episode(spec)

    result = await episode.exec("echo $BASE $EXTRA; echo err >&2; exit 4", env={"EXTRA": "x"})
    assert (result.stdout, result.stderr, result.exit_code) == ("b x\n", "err\n", 4)
    assert result.source == "interactive" and result.index == 1  # after the scripted step

    payload = bytes(range(256)) * 4  # binary-safe both ways
    await episode.write_file("/tmp/work/blob.bin", payload, mode=0o600)
    assert await episode.read_file("/tmp/work/blob.bin") == payload
    listing = await episode.exec(["stat", "-c", "%a %s", "/tmp/work/blob.bin"])
    assert listing.stdout.split() == ["600", "1024"]

    echoed = await episode.exec(["cat"], stdin="through stdin")
    assert echoed.stdout == "through stdin"

    await episode.write_file("/tmp/work/score", "0.5\n")
    status = await episode.status()
    assert status.state == "running" and status.steps_done == 4
    assert status.sandbox_id == sandbox_id_for(episode.id)
    assert await sandbox_exists(stack_config, status.sandbox_id)

    final = await episode.finish()
    assert final.outcome == "completed"
    assert final.reward is not None and final.reward.stdout == "0.5\n"
    assert [s.source for s in final.steps] == [
        "scripted",
        "interactive",
        "interactive",
        "interactive",
        "reward",
    ]
    assert not await sandbox_exists(stack_config, final.sandbox_id)


async def test_updates_are_rejected_after_finish(corral: Corral) -> None:
    episode = await corral.start_episode(INTERACTIVE)
    await episode.exec("true")
    await episode.finish()
    requests = {
        "exec": lambda: episode.exec("echo late"),
        "write_file": lambda: episode.write_file("/tmp/late", "x"),
        "read_file": lambda: episode.read_file("/etc/passwd"),
        "finish": lambda: episode.finish(),
    }
    for name, request in requests.items():
        # Finishing (the validator refuses), or ended: EpisodeEnded, a rejection too.
        with pytest.raises(EpisodeRejected, match=rf"refused {name}: .* is finishing|has ended"):
            await request()
    # Whether the workflow is closing (validator) or closed (server), it is a rejection.
    steps = (await episode.result()).steps
    assert [s.cmd for s in steps] == ["true"]


async def test_scripted_episode_refuses_finish(corral: Corral) -> None:
    episode = await corral.start_episode({"image": "busybox", "steps": ["sleep 1"]})
    with pytest.raises(EpisodeRejected, match="not interactive"):
        await episode.finish()
    assert (await episode.result()).outcome == "completed"


async def test_idle_ttl_times_out_and_tears_down(corral: Corral, stack_config: StackConfig) -> None:
    episode = await corral.start_episode({**INTERACTIVE, "timeouts": {"idle_ttl_s": 2}})
    await episode.exec("true")  # a request resets the idle timer; then nothing
    with pytest.raises(EpisodeTimedOut, match="idle for 2 s") as caught:
        await episode.result()
    assert caught.value.result is not None
    assert caught.value.result.outcome == "timed_out"
    assert not await sandbox_exists(stack_config, sandbox_id_for(episode.id))


async def test_max_lifetime_times_out_a_busy_episode(
    corral: Corral, stack_config: StackConfig
) -> None:
    spec = {"image": "busybox", "steps": ["sleep 60"], "timeouts": {"max_lifetime_s": 3}}
    episode = await corral.start_episode(spec)
    with pytest.raises(EpisodeTimedOut, match="maximum lifetime of 3 s") as caught:
        await episode.result()
    assert caught.value.result is not None and caught.value.result.outcome == "timed_out"
    assert not await sandbox_exists(stack_config, sandbox_id_for(episode.id))


async def test_cancel_tears_down(corral: Corral, stack_config: StackConfig) -> None:
    episode = await corral.start_episode(INTERACTIVE)
    await episode.exec("true")
    sandbox_id = (await episode.status()).sandbox_id
    assert await sandbox_exists(stack_config, sandbox_id)
    await episode.cancel()
    with pytest.raises(EpisodeCancelled):
        await episode.result()
    assert not await sandbox_exists(stack_config, sandbox_id)
    desc = await corral.client.get_workflow_handle(episode.id).describe()
    assert desc.status == WorkflowExecutionStatus.CANCELED


async def test_cancel_while_provisioning_leaves_nothing(
    corral: Corral, stack_config: StackConfig
) -> None:
    """A trainer's env closed right after it opened: the cancel lands while the
    node is still making the sandbox, and the teardown must still find it."""
    episodes = [await corral.start_episode(INTERACTIVE) for _ in range(3)]
    for episode in episodes:
        await episode.cancel()
    for episode in episodes:
        with pytest.raises(EpisodeCancelled):
            await episode.result()
        assert await sandboxes_of(stack_config, episode.id) == [], episode.id


async def test_cancel_during_a_long_step_tears_down(
    corral: Corral, stack_config: StackConfig
) -> None:
    episode = await corral.start_episode({"image": "busybox", "steps": ["sleep 120"]})
    await eventually(lambda: _state_is(episode, "running"), what="episode running")
    await asyncio.sleep(0.5)  # let the step start
    await episode.cancel()
    with pytest.raises(EpisodeCancelled):
        await episode.result()
    assert not await sandbox_exists(stack_config, sandbox_id_for(episode.id))


async def test_on_call_kill_signal(corral: Corral, stack_config: StackConfig) -> None:
    episode = await corral.start_episode({"image": "busybox", "steps": ["sleep 120"]})
    await eventually(lambda: _state_is(episode, "running"), what="episode running")
    await episode.kill(reason="looks stuck", by="alice")
    with pytest.raises(EpisodeKilled, match="killed by on-call by alice: looks stuck") as caught:
        await episode.result()
    assert caught.value.result is not None and caught.value.result.outcome == "killed"
    assert caught.value.rule is None  # on-call, not a rule
    assert not await sandbox_exists(stack_config, sandbox_id_for(episode.id))
    desc = await corral.client.get_workflow_handle(episode.id).describe()
    assert desc.status == WorkflowExecutionStatus.FAILED  # red in the Web UI


async def test_kill_while_the_sandbox_is_being_made_leaves_nothing(
    corral: Corral, stack_config: StackConfig
) -> None:
    """A kill can land before the node has made the sandbox (a lean run is
    placed, not yet provisioned): the episode closes only once its node has
    stopped the run, so no sandbox appears after the episode ended."""

    async def start_then_kill(delay_s: float) -> str:
        episode = await corral.start_episode({"image": "busybox", "steps": ["sleep 120"]})
        await asyncio.sleep(delay_s)
        await episode.kill(reason="early", by="test")
        with pytest.raises(EpisodeKilled):
            await episode.result()
        return episode.id

    ids = await asyncio.gather(*(start_then_kill(d) for d in (0.0, 0.02, 0.05, 0.1, 0.2, 0.4)))
    await asyncio.sleep(2)  # a late provision would have made its sandbox by now
    left = {episode_id: await sandboxes_of(stack_config, episode_id) for episode_id in ids}
    assert not any(left.values()), left


async def test_search_attributes_while_running_and_after(corral: Corral) -> None:
    spec = {**INTERACTIVE, "tenant": "team-sa", "labels": {"run": "sa"}}
    episode = await corral.start_episode(spec)
    await episode.exec("true")

    async def listed_running() -> bool:
        rows = await corral.list_episodes(
            f"EpisodeState = 'running' AND Tenant = 'team-sa' AND WorkflowId = '{episode.id}'"
        )
        return len(rows) == 1 and bool(rows[0].node)

    await eventually(listed_running, what="episode listed as running")
    row = (await corral.list_episodes(f"WorkflowId = '{episode.id}'"))[0]
    assert (row.state, row.image, row.tenant, row.status) == (
        "running",
        "busybox",
        "team-sa",
        "RUNNING",
    )
    assert row.node == (await episode.status()).node

    await episode.finish()

    async def listed_completed() -> bool:
        rows = await corral.list_episodes(
            f"EpisodeState = 'completed' AND WorkflowId = '{episode.id}'"
        )
        return len(rows) == 1 and rows[0].status == "COMPLETED"

    await eventually(listed_completed, what="episode listed as completed")


async def test_placement_uses_both_nodes(corral: Corral, stack_config: StackConfig) -> None:
    spec = {"image": "busybox", "steps": ["true"]}
    results = await asyncio.gather(*(corral.run_episode(spec) for _ in range(16)))
    nodes = {r.node for r in results}
    # On failure, what placement read: each node's state, admission and age.
    seen = [
        (n.name, n.state, n.heartbeat.use.admitting, n.heartbeat.use.closed, str(n.last_seen))
        for n in await list_nodes(corral.client)
    ]
    assert nodes == set(stack_config.node_names()), (nodes, seen)


async def _state_is(episode: object, state: str) -> bool:
    return (await episode.status()).state == state  # type: ignore[attr-defined]
