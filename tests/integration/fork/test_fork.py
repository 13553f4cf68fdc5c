"""Fork, snapshot and hibernate on the real stack (two nodes, containerd + runc).

Each child of a fork is a durable episode with its own sandbox that starts
from the parent's filesystem; writes never cross between parent and children.
"""

from __future__ import annotations

import pytest
from episode_helpers import eventually, sandbox_exists

from contract.config import StackConfig
from contract.ids import snapshot_ref
from corral.errors import InvalidEpisodeSpec
from corral.sdk import Corral, Episode
from sandbox.client import Containerd

pytestmark = pytest.mark.integration

INTERACTIVE = {"image": "busybox", "interactive": True}


async def _finish_all(episodes: list[Episode], config: StackConfig) -> None:
    for episode in episodes:
        result = await episode.finish()
        assert result.outcome == "completed", result.reason
        assert not await sandbox_exists(config, result.sandbox_id)


async def _gone(config: StackConfig, sandbox_id: str) -> bool:
    return not await sandbox_exists(config, sandbox_id)


async def test_fork_children_share_the_parent_filesystem_not_their_writes(
    corral: Corral, stack_config: StackConfig
) -> None:
    parent = await corral.start_episode(INTERACTIVE)
    await parent.write_file("/data/parent.txt", "from the parent\n")
    children = await parent.fork(4)
    assert len({child.id for child in children}) == 4

    for i, child in enumerate(children):
        assert await child.read_file("/data/parent.txt") == b"from the parent\n"
        await child.write_file("/data/mine.txt", f"child {i}\n")
    for i, child in enumerate(children):
        assert await child.read_file("/data/mine.txt") == f"child {i}\n".encode()
        assert (await child.exec("ls /data")).stdout == "mine.txt\nparent.txt\n"
    # The parent goes on, untouched by its children.
    assert (await parent.exec("ls /data")).stdout == "parent.txt\n"
    await parent.write_file("/data/later.txt", "after the fork\n")
    assert not (await children[0].exec("test -e /data/later.txt")).ok

    # Lineage, through the SDK (visibility is eventually consistent).
    ids = sorted(child.id for child in children)

    async def listed() -> bool:
        rows = await corral.list_episodes(parent=parent.id)
        return sorted(row.episode_id for row in rows) == ids

    await eventually(listed, what="the 4 children listed under their parent")
    rows = await corral.list_episodes(parent=parent.id)
    assert {row.parent_episode for row in rows} == {parent.id}
    # ... and through a raw visibility query, as the Web UI and temporal CLI run it.
    query = f"ParentEpisode = '{parent.id}'"
    raw = [wf.id async for wf in corral.client.list_workflows(query)]
    assert sorted(raw) == ids
    described = await corral.client.get_workflow_handle(ids[0]).describe()
    assert await described.memo_value("parent_episode") == parent.id

    await _finish_all([*children, parent], stack_config)


async def test_fork_with_steps_runs_them_in_each_child(
    corral: Corral, stack_config: StackConfig
) -> None:
    parent = await corral.start_episode({**INTERACTIVE, "reward": "cat /n"})
    await parent.exec("echo 1 > /n")
    children = await parent.fork(2, steps=["echo $(( $(cat /n) + 1 )) > /n"])
    for child in children:
        result = await child.result()
        assert result.outcome == "completed", result.reason
        assert result.reward is not None and result.reward.stdout == "2\n"
        # A short scripted episode tears its sandbox down just after its result.
        await eventually(
            lambda: _gone(stack_config, result.sandbox_id),  # noqa: B023 - awaited here
            what="the child's sandbox torn down",
        )
    final = await parent.finish()
    assert final.reward is not None and final.reward.stdout == "1\n"


async def test_snapshot_starts_a_new_episode_on_the_other_node(
    corral: Corral, stack_config: StackConfig
) -> None:
    source = await corral.start_episode(INTERACTIVE, node="node-1")
    await source.write_file("/work/state.txt", "checkpoint\n")
    assert (await source.exec("rmdir /var")).ok  # a deletion travels too (a whiteout)
    snap = await source.snapshot("ckpt")
    assert snap.node == "node-1" and snap.ref.endswith(":ckpt")

    restored = await corral.start_episode({**INTERACTIVE, "image": snap.ref}, node="node-2")
    assert (await restored.status()).node == "node-2"
    assert await restored.read_file("/work/state.txt") == b"checkpoint\n"
    assert not (await restored.exec("test -e /var")).ok
    assert (await restored.exec("test -e /bin/sh")).ok
    await _finish_all([restored, source], stack_config)


async def test_hibernate_frees_the_sandbox_and_restore_keeps_files(
    corral: Corral, stack_config: StackConfig
) -> None:
    spec = {**INTERACTIVE, "timeouts": {"hibernate_after_s": 1, "idle_ttl_s": 600}}
    episode = await corral.start_episode(spec)
    await episode.write_file("/keep/me.txt", "still here\n")
    sandbox_id = (await episode.status()).sandbox_id

    async def hibernated() -> bool:
        return (await episode.status()).state == "hibernated"

    await eventually(hibernated, what="the idle episode hibernated")
    assert not await sandbox_exists(stack_config, sandbox_id)

    # The next request restores it first; the trainer sees only a slower step.
    assert (await episode.exec("cat /keep/me.txt")).stdout == "still here\n"
    status = await episode.status()
    assert status.state in ("running", "hibernated")  # it may idle out again
    assert await _hibernation_images(stack_config, episode.id)
    await _finish_all([episode], stack_config)
    # Hibernation snapshots are the episode's own: its teardown removes them.
    assert await _hibernation_images(stack_config, episode.id) == []


async def _hibernation_images(config: StackConfig, episode_id: str) -> list[str]:
    """Every node's images that are this episode's hibernation snapshots."""
    repo = snapshot_ref(episode_id, "x").rsplit(":", 1)[0]
    names = []
    for node in config.node_names():
        async with await Containerd.connect(
            str(config.containerd_socket(node)), namespace=config.nodes.containerd_namespace
        ) as client:
            names += [
                image.name
                for image in await client.images.list()
                if f"{repo}:hibernate-" in image.name
            ]
    return names


async def test_bad_fork_and_snapshot_requests_are_refused(corral: Corral) -> None:
    episode = await corral.start_episode(INTERACTIVE)
    with pytest.raises(InvalidEpisodeSpec, match="at least 1"):
        await episode.fork(0)
    with pytest.raises(InvalidEpisodeSpec, match="snapshot name"):
        await episode.snapshot("no spaces allowed")
    await episode.finish()
