"""Episodes with the fork-era Updates and states, whose histories the replay tests
replay (tests/unit/workflows/test_replay.py): a snapshot Update, and an episode
that hibernates and is restored by its next request. With
CORRAL_RECORD_HISTORIES=1 the histories are written to tests/data/histories/:

    CORRAL_RECORD_HISTORIES=1 .venv/bin/pytest -q tests/integration/fork/test_fork_histories.py
"""

from __future__ import annotations

import os

import pytest
from episode_helpers import eventually
from test_episode_histories import _record

from corral.sdk import Corral

pytestmark = pytest.mark.integration


async def test_snapshot_history(corral: Corral) -> None:
    spec = {"image": "busybox", "interactive": True, "reward": "cat /tmp/r"}
    episode = await corral.start_episode(spec, episode_id=f"hist-snapshot-{os.getpid()}")
    await episode.write_file("/tmp/r", "1\n")
    snap = await episode.snapshot("h")
    assert snap.ref.endswith(":h")
    final = await episode.finish()
    assert final.reward is not None and final.reward.stdout == "1\n"
    await _record(corral, episode, "snapshot")


async def test_hibernate_history(corral: Corral) -> None:
    spec = {
        "image": "busybox",
        "interactive": True,
        "reward": "cat /data/r",
        "timeouts": {"hibernate_after_s": 1},
    }
    episode = await corral.start_episode(spec, episode_id=f"hist-hibernate-{os.getpid()}")
    await episode.write_file("/data/r", "2\n")  # not /tmp: a tmpfs is not snapshotted

    async def hibernated() -> bool:
        return (await episode.status()).state == "hibernated"

    await eventually(hibernated, what="the idle episode hibernated")
    assert await episode.read_file("/data/r") == b"2\n"  # restored first
    final = await episode.finish()
    assert final.reward is not None and final.reward.stdout == "2\n"
    await _record(corral, episode, "hibernate")
