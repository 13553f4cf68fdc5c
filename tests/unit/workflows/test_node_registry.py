"""NodeRegistryWorkflow on the time-skipping test server: joins, drains, losses.

`corral.node_lost` is a fake that records whom it was asked to tell; the real
fan-out (visibility query + signals) runs on the stack in the fleet tests.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from temporalio import activity
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker
from test_episode_time_skipping import _test_server

from contract.models import NodeCapacity, NodeHeartbeat, NodeLostInput, NodeUsage
from workers.temporal import workflow_runner
from workflows.nodes import (
    FORGET_LOST_AFTER_S,
    HEARTBEAT_EVERY_S,
    KEEPALIVE_EVERY_S,
    LOST_AFTER_S,
    REGISTRY_SHARDS,
    RETELL_LOST_EVERY_S,
    BeatGate,
    NodeRegistryWorkflow,
    drain_node,
    forget_node,
    list_nodes,
    node_registry,
    send_heartbeat,
    shard_of,
)

QUEUE = "registry-under-test"
_NAMES = ("a", "b", "c", "d")


def _beat(name: str) -> NodeHeartbeat:
    return NodeHeartbeat(
        name=name,
        task_queue=f"corral-node-{name}",
        version="test",
        capacity=NodeCapacity(cores=2, memory_mb=1024, pids=1000, max_sandboxes=10),
        use=NodeUsage(),
    )


@pytest.fixture
async def registry() -> AsyncIterator[tuple[WorkflowEnvironment, list[str]]]:
    """A registry worker on the time-skipping server, and whom `node_lost` was asked to tell."""
    told: list[str] = []

    @activity.defn(name="corral.node_lost")
    async def node_lost(lost: NodeLostInput) -> int:
        told.append(lost.node)
        return 0

    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=_test_server(), data_converter=pydantic_data_converter
    )
    try:
        async with Worker(
            env.client,
            task_queue=QUEUE,
            workflows=[NodeRegistryWorkflow],
            activities=[node_lost],
            workflow_runner=workflow_runner(),
        ):
            yield env, told
            for name in _NAMES:  # each node's shard that was started
                with contextlib.suppress(RPCError):  # terminated already, with a sibling
                    await node_registry(env.client, name).terminate()
    finally:
        await env.shutdown()


async def test_join_drain_and_loss(registry: tuple[WorkflowEnvironment, list[str]]) -> None:
    env, told = registry
    await send_heartbeat(env.client, QUEUE, _beat("a"))
    await send_heartbeat(env.client, QUEUE, _beat("b"))
    assert {(n.name, n.state) for n in await list_nodes(env.client)} == {
        ("a", "ready"),
        ("b", "ready"),
    }
    await drain_node(env.client, "b")
    assert {n.name: n.state for n in await list_nodes(env.client)}["b"] == "draining"

    # "a" keeps beating, "b" goes silent: lost within LOST_AFTER_S plus a check.
    for _ in range(int(LOST_AFTER_S // 5) + 2):
        await env.sleep(timedelta(seconds=5))
        await send_heartbeat(env.client, QUEUE, _beat("a"))
    states = {n.name: n.state for n in await list_nodes(env.client)}
    assert states == {"a": "ready", "b": "lost"}
    assert told == ["b"]

    await env.sleep(timedelta(seconds=RETELL_LOST_EVERY_S + 10))
    assert told.count("b") >= 2  # told again while it stays lost

    await send_heartbeat(env.client, QUEUE, _beat("b"))  # it comes back, still drained
    assert {n.name: n.state for n in await list_nodes(env.client)}["b"] == "draining"


async def test_forget_drops_a_node_at_once(registry: tuple[WorkflowEnvironment, list[str]]) -> None:
    env, _ = registry
    for name in ("c", "d"):
        await send_heartbeat(env.client, QUEUE, _beat(name))
    await drain_node(env.client, "c")
    await forget_node(env.client, "c", by="test")
    assert [n.name for n in await list_nodes(env.client)] == ["d"]
    # Forgotten means forgotten: it comes back ready, not drained.
    await send_heartbeat(env.client, QUEUE, _beat("c"))
    assert {n.name: n.state for n in await list_nodes(env.client)} == {"c": "ready", "d": "ready"}


async def test_a_lost_node_leaves_the_list_after_a_while(
    registry: tuple[WorkflowEnvironment, list[str]],
) -> None:
    env, _ = registry
    await send_heartbeat(env.client, QUEUE, _beat("a"))
    await env.sleep(timedelta(seconds=LOST_AFTER_S + 15))
    assert {n.name: n.state for n in await list_nodes(env.client)} == {"a": "lost"}
    await env.sleep(timedelta(seconds=FORGET_LOST_AFTER_S))
    assert await list_nodes(env.client) == []


def test_nodes_spread_over_the_shards() -> None:
    names = [f"node-{i}" for i in range(1000)]
    per_shard = [0] * REGISTRY_SHARDS
    for name in names:
        per_shard[shard_of(name)] += 1
    # Even enough that no shard takes twice its share of the heartbeats.
    assert max(per_shard) < 2 * len(names) / REGISTRY_SHARDS


def test_a_beat_is_sent_on_news_or_as_the_keep_alive() -> None:
    gate, beat = BeatGate(), _beat("a")
    assert gate.due(beat, 0.0)  # the first beat joins the node
    gate.sent(beat, 0.0)
    assert not gate.due(beat.model_copy(update={"load1": 3.0}), 1.0)  # no news for placement
    busier = beat.model_copy(update={"use": NodeUsage(sandboxes=1)})
    assert gate.due(busier, 1.0)
    assert gate.due(beat, KEEPALIVE_EVERY_S)  # nothing new, but it must say it is alive
    # Sent a little after one tick, the keep-alive still goes two ticks later.
    gate.sent(beat, 0.3)
    assert gate.due(beat, 2 * HEARTBEAT_EVERY_S)
