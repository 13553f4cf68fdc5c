"""A provision that meets containerd down or restarting is retried, not failed."""

from __future__ import annotations

import asyncio

import pytest

from corral.sdk import Corral
from workers.stack import Stack

pytestmark = pytest.mark.integration


async def test_episode_rides_out_a_containerd_restart(corral: Corral, stack: Stack) -> None:
    node = stack.config.node_names()[0]
    daemon = stack.daemon(node)
    await daemon.stop()  # containerd is gone when the episode reaches the node
    try:
        episode = await corral.start_episode(
            {"image": "busybox", "steps": ["echo survived"]}, node=node
        )
        await asyncio.sleep(3)  # a few provision attempts fail meanwhile
    finally:
        await stack._start_containerd(node)
    result = await episode.result(timeout_s=120)
    assert result.outcome == "completed"
    assert result.steps[0].stdout == "survived\n"
