"""Helpers for the policy integration tests (imported by the test modules)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from corral.sdk import Corral, Episode, EpisodeSummary
from sandbox import Containerd

STATE_CAP_S = 60.0  # a cap so a broken stack fails instead of hanging; not a target


async def start_interactive(corral: Corral, node: str | None = None) -> tuple[Episode, Any]:
    """An interactive busybox episode, once it is running; returns (episode, status)."""
    ep = await corral.start_episode({"image": "busybox", "interactive": True}, node=node)
    status = await wait_status(ep, lambda s: s.state == "running")
    return ep, status


async def wait_status(ep: Episode, pred: Any, cap_s: float = STATE_CAP_S) -> Any:
    deadline = time.monotonic() + cap_s
    while True:
        status = await ep.status()
        if pred(status):
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"episode {ep.id}: condition not met; last status {status}")
        await asyncio.sleep(0.1)


async def wait_listed(
    corral: Corral, episode_id: str, pred: Any, cap_s: float = STATE_CAP_S
) -> EpisodeSummary:
    """Visibility is eventually consistent: poll list_episodes until `pred` holds."""
    deadline = time.monotonic() + cap_s
    row: EpisodeSummary | None = None
    while time.monotonic() < deadline:
        rows = await corral.list_episodes(f"WorkflowId = '{episode_id}'")
        row = rows[0] if rows else None
        if row is not None and pred(row):
            return row
        await asyncio.sleep(0.2)
    raise AssertionError(f"episode {episode_id}: visibility condition not met; last row {row}")


async def sandbox_status(client: Containerd, sandbox_id: str) -> str:
    return await (await client.get_sandbox(sandbox_id)).status()


async def end_episode(ep: Episode) -> None:
    """Best-effort cleanup: kill and wait, whatever state the episode is in
    (a closed episode refuses the signal; a killed one raises EpisodeKilled)."""
    with contextlib.suppress(Exception):
        await ep.kill(reason="test cleanup")
    with contextlib.suppress(Exception):
        await ep.result()
