"""The workflow worker's registry view: which shards it asks, and how often.

A fake client stands in for Temporal here (the logic is which shard is asked
when); the stack's placement tests run the real one."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from temporalio.service import RPCError, RPCStatusCode

from contract.models import NodeCapacity, NodeHeartbeat, NodeInfo, NodeUsage
from workers.node_directory import EMPTY_SHARDS_EVERY, NodeDirectory
from workflows.nodes import REGISTRY_SHARDS, registry_id

SHARD_IDS = {registry_id(shard): shard for shard in range(REGISTRY_SHARDS)}


def node(name: str) -> NodeInfo:
    beat = NodeHeartbeat(
        name=name,
        task_queue=f"corral-node-{name}",
        version="test",
        capacity=NodeCapacity(cores=2, memory_mb=8192, pids=10_000, max_sandboxes=100),
        use=NodeUsage(),
    )
    now = datetime.now(UTC)
    return NodeInfo(heartbeat=beat, last_seen=now, joined=now)


class FakeClient:
    """Registry shards as a dict; records each shard query and each listing."""

    def __init__(self, shards: dict[int, list[NodeInfo]], *, listing_fails: bool = False) -> None:
        self.shards = shards
        self.queried: list[int] = []
        self.listings = 0
        self.listing_fails = listing_fails

    def get_workflow_handle_for(self, _run: Any, workflow_id: str) -> Any:
        shard = SHARD_IDS[workflow_id]

        async def query(_query: Any) -> list[NodeInfo]:
            self.queried.append(shard)
            if shard not in self.shards:
                raise RPCError("not found", RPCStatusCode.NOT_FOUND, b"")
            return self.shards[shard]

        return SimpleNamespace(query=query)

    def list_workflows(self, _query: str) -> AsyncIterator[Any]:
        self.listings += 1
        if self.listing_fails:
            raise RPCError("visibility down", RPCStatusCode.UNAVAILABLE, b"")

        async def runs() -> AsyncIterator[Any]:
            for shard in self.shards:
                yield SimpleNamespace(id=registry_id(shard))

        return runs()


async def test_empty_shards_are_found_by_one_listing_not_a_query_each() -> None:
    client = FakeClient({3: [node("a")]})
    directory = NodeDirectory(client)  # type: ignore[arg-type]
    await directory.refresh()  # the first refresh looks for shards with nodes
    assert client.listings == 1 and client.queried == [3]
    assert [info.name for info in directory.nodes()] == ["a"]
    client.queried.clear()
    for _ in range(EMPTY_SHARDS_EVERY - 1):
        await directory.refresh()  # only the shard that holds nodes
    assert client.queried == [3] * (EMPTY_SHARDS_EVERY - 1) and client.listings == 1
    client.shards[7] = [node("b")]  # a node joins a new shard
    await directory.refresh()
    assert client.listings == 2
    assert [info.name for info in directory.nodes()] == ["a", "b"]


async def test_a_cold_view_asks_every_shard() -> None:
    client = FakeClient({5: [node("a")]})
    directory = NodeDirectory(client)  # type: ignore[arg-type]
    assert [info.name for info in await directory.nodes_when_empty()] == ["a"]
    assert sorted(client.queried) == list(range(REGISTRY_SHARDS)) and client.listings == 0


async def test_without_visibility_every_shard_is_asked() -> None:
    client = FakeClient({2: [node("a")]}, listing_fails=True)
    directory = NodeDirectory(client)  # type: ignore[arg-type]
    await directory.refresh()
    assert sorted(client.queried) == list(range(REGISTRY_SHARDS))
    assert [info.name for info in directory.nodes()] == ["a"]
