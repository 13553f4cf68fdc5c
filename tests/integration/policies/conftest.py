"""Shared helpers for the policy tests: the stack's sensors must be attached."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest_asyncio

from sandbox import Containerd
from workers.stack import Stack

# A cap so a broken stack fails instead of hanging; not a performance target.
SENSOR_READY_CAP_S = 240.0


@pytest_asyncio.fixture(scope="session")
async def sensors(stack: Stack) -> Stack:
    """The stack, once every node's sensor has attached bpftrace (it compiles for seconds)."""
    config = stack.config
    deadline = time.monotonic() + SENSOR_READY_CAP_S
    waiting = list(config.node_names())
    while waiting and time.monotonic() < deadline:
        waiting = [n for n in waiting if not (config.state / "run" / f"sensor-{n}.ready").exists()]
        await asyncio.sleep(0.5)
    if waiting:
        tails = "\n".join(
            f"--- sensor-{n}:\n{stack.process(f'sensor-{n}').log_tail(15)}" for n in waiting
        )
        raise AssertionError(f"sensors not attached within {SENSOR_READY_CAP_S:g} s:\n{tails}")
    return stack


@pytest_asyncio.fixture
async def node_clients(stack: Stack) -> AsyncIterator[dict[str, Containerd]]:
    config = stack.config
    clients = {
        n: await Containerd.connect(
            str(config.containerd_socket(n)), namespace=config.nodes.containerd_namespace
        )
        for n in config.node_names()
    }
    yield clients
    for client in clients.values():
        await client.close()
