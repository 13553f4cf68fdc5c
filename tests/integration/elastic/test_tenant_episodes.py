"""Real episodes on the session stack under a tenant quota: wait, start, reject.

The SDK reads tenants from its config; the test gives its client a copy of
the stack's config with two tenants declared (the stack itself needs none).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from contract.errors import CorralError
from contract.models import EpisodeSpec, TenantConfig
from corral.errors import EpisodeError, EpisodeNotAdmitted
from corral.sdk import Corral, Episode
from workers.stack import Stack

pytestmark = pytest.mark.integration


@pytest_asyncio.fixture
async def tenant_corral(stack: Stack, corral: Corral) -> AsyncIterator[tuple[Corral, str]]:
    name = f"t{uuid.uuid4().hex[:6]}"
    tenants = {
        name: TenantConfig(max_episodes=1, images=["busybox"]),
        f"{name}-strict": TenantConfig(max_episodes=1, on_quota="reject"),
    }
    config = stack.config.model_copy(update={"tenants": tenants})
    yield Corral(corral.client, config), name


async def _until_state(episode: Episode, state: str) -> str:
    deadline = time.monotonic() + 120  # a correctness wait (under the 300 s test timeout)
    while (status := await episode.status()).state != state:
        assert time.monotonic() < deadline, (
            f"{episode.id} stayed {status.state} ({status.reason}), never {state}"
        )
        await asyncio.sleep(0.2)
    return status.reason


async def _end(episode: Episode) -> None:
    """Cancel and wait until it has closed (its sandbox torn down)."""
    with contextlib.suppress(CorralError):  # it may have closed already
        await episode.cancel()
    with contextlib.suppress(EpisodeError):
        await episode.result()


async def test_a_second_episode_waits_for_its_tenants_quota_then_runs(
    tenant_corral: tuple[Corral, str],
) -> None:
    client, tenant = tenant_corral
    spec = EpisodeSpec(image="busybox", interactive=True, tenant=tenant)
    first = await client.start_episode(spec)
    second = None
    try:
        # Admission is first come, first served by request: the second starts
        # once the first holds the room (started together, either may win).
        await _until_state(first, "running")
        second = await client.start_episode(spec)
        reason = await _until_state(second, "waiting")
        assert reason == f"tenant '{tenant}' is at its quota of 1 concurrent episodes"
        await first.finish()
        await _until_state(second, "running")
        assert (await second.exec(["echo", "admitted"])).stdout == "admitted\n"
    finally:
        for episode in (first, second):
            if episode is not None:
                await _end(episode)


async def test_rules_and_reject_quotas_refuse_with_episode_not_admitted(
    tenant_corral: tuple[Corral, str],
) -> None:
    client, tenant = tenant_corral
    with pytest.raises(EpisodeNotAdmitted, match=f"tenant '{tenant}' does not allow image"):
        await client.start_episode(EpisodeSpec(image="debian", tenant=tenant))
    strict = EpisodeSpec(image="busybox", interactive=True, tenant=f"{tenant}-strict")
    first = await client.start_episode(strict)
    try:
        await _until_state(first, "running")
        second = await client.start_episode(strict)
        with pytest.raises(EpisodeNotAdmitted, match="is at its quota of 1 concurrent episodes"):
            await second.result()
    finally:
        await _end(first)
