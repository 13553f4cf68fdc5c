"""Helpers for the episode tests: sandbox presence per node, polling."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from contract.config import StackConfig
from contract.labels import OWNER_LABEL
from sandbox import Containerd


async def sandbox_ids(config: StackConfig) -> dict[str, set[str]]:
    """Every container id each node's containerd holds right now."""
    held: dict[str, set[str]] = {}
    for node in config.node_names():
        async with await Containerd.connect(
            str(config.containerd_socket(node)), namespace=config.nodes.containerd_namespace
        ) as client:
            held[node] = set(await client.container_ids())
    return held


async def labelled(config: StackConfig, labels: dict[str, str]) -> list[tuple[str, str]]:
    """(node, sandbox id) of every sandbox any node holds with these labels."""
    found: list[tuple[str, str]] = []
    for node in config.node_names():
        async with await Containerd.connect(
            str(config.containerd_socket(node)), namespace=config.nodes.containerd_namespace
        ) as client:
            found += [(node, info.id) for info in await client.list_sandboxes(labels)]
    return found


async def sandboxes_of(config: StackConfig, workflow_id: str) -> list[str]:
    """Every sandbox any node holds for this episode (a warm claim keeps its pool id)."""
    return [f"{node}/{sid}" for node, sid in await labelled(config, {OWNER_LABEL: workflow_id})]


async def sandbox_exists(config: StackConfig, sandbox_id: str) -> bool:
    return any(sandbox_id in ids for ids in (await sandbox_ids(config)).values())


async def eventually(predicate: Any, timeout_s: float = 60.0, what: str = "condition") -> Any:
    """Poll `predicate()` (sync or async) until truthy; returns its value.

    A correctness wait with a generous deadline, never a timing assertion.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout_s:g} s")
        await asyncio.sleep(0.2)
