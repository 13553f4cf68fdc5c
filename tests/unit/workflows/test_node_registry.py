"""NodeRegistryWorkflow on the time-skipping test server: joins, drains, losses.

`corral.node_lost` is a fake that records whom it was asked to tell; the real
fan-out (visibility query + signals) runs on the stack in the fleet tests.
Nodes are the real presence activity (`activities/presence.py`) on a worker of
the node's queue, heartbeating every 50 ms; a node with no such worker never
picks presence up.

The test server skips no time while an activity is pending, and presence is
one for the whole test: the registry's clock runs in real time here. So its
timeouts are cut by `CLOCK_SCALE` (25 s lost verdict: 5 s), every proportion
kept; `_pass` steps one check at a time.
"""

from __future__ import annotations

import asyncio
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

from activities.presence import Presence
from contract.models import NodeCapacity, NodeHeartbeat, NodeLostInput, NodeUsage
from workers.temporal import workflow_runner
from workflows import nodes
from workflows.nodes import (
    FORGET_LOST_AFTER_S,
    HEARTBEAT_EVERY_S,
    KEEPALIVE_EVERY_S,
    MAX_SIGNALS_PER_RUN,
    REGISTRY_SHARDS,
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
CLOCK_SCALE = 5.0
_SCALED = (
    "LOST_AFTER_S",
    "PRESENCE_TIMEOUT_S",
    "CHECK_EVERY_S",
    "IDLE_CHECK_EVERY_S",
    "RETELL_LOST_EVERY_S",
)


@pytest.fixture(autouse=True)
def _fast_registry_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    # The workflow reads these at run time (its module is passed through, not copied).
    for name in _SCALED:
        monkeypatch.setattr(nodes, name, getattr(nodes, name) / CLOCK_SCALE)


def _beat(name: str, boot: str = "1") -> NodeHeartbeat:
    return NodeHeartbeat(
        name=name,
        task_queue=f"corral-node-{name}",
        version="test",
        capacity=NodeCapacity(cores=2, memory_mb=1024, pids=1000, max_sandboxes=10),
        use=NodeUsage(),
        boot=boot,
    )


@contextlib.asynccontextmanager
async def _node(
    env: WorkflowEnvironment, name: str, presence: Presence | None = None
) -> AsyncIterator[Presence]:
    """A node worker that runs only presence, heartbeating every 50 ms."""
    presence = presence or Presence(every_s=0.05)
    async with Worker(
        env.client,
        task_queue=f"corral-node-{name}",
        activities=presence.activities(),
        max_heartbeat_throttle_interval=timedelta(milliseconds=50),
        default_heartbeat_throttle_interval=timedelta(milliseconds=50),
    ):
        yield presence


async def _pass(env: WorkflowEnvironment, seconds: float) -> None:
    """Let `seconds` of workflow time go by, one registry check a step, the nodes
    heartbeating between steps."""
    step = nodes.CHECK_EVERY_S
    for _ in range(round(seconds / step)):
        await env.sleep(timedelta(seconds=step))
        await asyncio.sleep(0.05)


async def _states(env: WorkflowEnvironment) -> dict[str, str]:
    return {n.name: n.state for n in await list_nodes(env.client)}


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
    quiet = False
    b_presence = Presence(silenced=lambda: quiet, every_s=0.05)
    async with _node(env, "a"), _node(env, "b", b_presence):
        await send_heartbeat(env.client, QUEUE, _beat("a"))
        await send_heartbeat(env.client, QUEUE, _beat("b"))
        assert await _states(env) == {"a": "ready", "b": "ready"}
        await drain_node(env.client, "b")
        assert (await _states(env))["b"] == "draining"

        # Neither signals again; "a" stays by its presence alone, "b" goes
        # quiet and is lost when its presence times out.
        quiet = True
        await _pass(env, nodes.LOST_AFTER_S + 2 * nodes.CHECK_EVERY_S)
        assert await _states(env) == {"a": "ready", "b": "lost"}
        assert told == ["b"]
        assert {n.name: n.present for n in await list_nodes(env.client)} == {"a": True, "b": False}

        await _pass(env, nodes.RETELL_LOST_EVERY_S + 2 * nodes.CHECK_EVERY_S)
        assert told.count("b") >= 2  # told again while it stays lost

        # Its heartbeats get out again: refused (timed out), so presence ends on
        # the node, which is not its death: the beat loop's keep-alive rejoins it.
        quiet = False
        for _ in range(50):
            if not b_presence.armed:
                break
            await asyncio.sleep(0.1)
        assert not b_presence.armed
        await send_heartbeat(env.client, QUEUE, _beat("b"))  # it comes back, still drained
        await _pass(env, 2 * nodes.CHECK_EVERY_S)
        assert (await _states(env))["b"] == "draining"
        assert b_presence.armed


async def test_a_node_that_never_picks_up_presence_is_lost(
    registry: tuple[WorkflowEnvironment, list[str]],
) -> None:
    env, told = registry
    await send_heartbeat(env.client, QUEUE, _beat("c"))  # no worker polls its queue
    await _pass(env, nodes.LOST_AFTER_S + nodes.CHECK_EVERY_S)
    assert await _states(env) == {"c": "lost"}
    assert told == ["c"]


async def test_a_stopped_worker_is_lost_unless_it_comes_back(
    registry: tuple[WorkflowEnvironment, list[str]],
) -> None:
    env, told = registry
    async with _node(env, "a"), _node(env, "b"):
        await send_heartbeat(env.client, QUEUE, _beat("a", boot="1"))
        await send_heartbeat(env.client, QUEUE, _beat("b", boot="1"))
        await _pass(env, 2 * nodes.CHECK_EVERY_S)
    # Both workers stopped (`NodeStopping`): neither is lost at once.
    await _pass(env, 2 * nodes.CHECK_EVERY_S)
    assert await _states(env) == {"a": "ready", "b": "ready"}
    async with _node(env, "a"):  # "a" restarts, "b" does not
        await send_heartbeat(env.client, QUEUE, _beat("a", boot="2"))
        await _pass(env, nodes.LOST_AFTER_S + 2 * nodes.CHECK_EVERY_S)
        assert await _states(env) == {"a": "ready", "b": "lost"}
        assert told == ["b"]


async def test_a_restarted_worker_is_not_lost_by_its_predecessor(
    registry: tuple[WorkflowEnvironment, list[str]],
) -> None:
    env, told = registry
    dead = Presence(silenced=lambda: True, every_s=0.05)  # a crash: no heartbeat, no word
    async with _node(env, "a", dead):
        await send_heartbeat(env.client, QUEUE, _beat("a", boot="1"))
        await _pass(env, 2 * nodes.CHECK_EVERY_S)
        # The new worker, beside the hung old one (on a queue of its own: the SDK
        # allows one worker a queue per process).
        async with _node(env, "a-2"):
            beat = _beat("a", boot="2").model_copy(update={"task_queue": "corral-node-a-2"})
            await send_heartbeat(env.client, QUEUE, beat)
            await _pass(env, nodes.LOST_AFTER_S + 2 * nodes.CHECK_EVERY_S)
            assert await _states(env) == {"a": "ready"}
    assert told == []


async def test_continue_as_new_arms_presence_again(
    registry: tuple[WorkflowEnvironment, list[str]],
) -> None:
    env, told = registry
    async with _node(env, "a") as presence:
        await send_heartbeat(env.client, QUEUE, _beat("a"))
        first = (await node_registry(env.client, "a").describe()).run_id
        for _ in range(MAX_SIGNALS_PER_RUN // 100):
            await asyncio.gather(
                *(send_heartbeat(env.client, QUEUE, _beat("a")) for _ in range(100))
            )
        await _pass(env, nodes.CHECK_EVERY_S)
        assert (await node_registry(env.client, "a").describe()).run_id != first
        # The old run's presence is refused at its next heartbeat and ends; the
        # new run's runs on, and the node outlives several timeouts.
        await _pass(env, 3 * nodes.LOST_AFTER_S)
        assert await _states(env) == {"a": "ready"}
        assert presence.armed
    assert told == []


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
    await env.sleep(timedelta(seconds=nodes.LOST_AFTER_S + 3 * nodes.CHECK_EVERY_S))
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
    assert not gate.due(beat, KEEPALIVE_EVERY_S, present=True)  # its presence says it
    # Sent a little after one tick, the keep-alive still goes two ticks later.
    gate.sent(beat, 0.3)
    assert gate.due(beat, 2 * HEARTBEAT_EVERY_S)
