"""Admission on a real Temporal server: quota waits, rejections, fair order.

A stand-in episode workflow does what `EpisodeWorkflow` does with admission
(`Admission.admit` before it runs, `release` when it ends) and nothing else,
so these tests show the admission workflow's behaviour on its own.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
import yaml
from pydantic import BaseModel
from temporalio import workflow
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from contract.models import AdmissionPolicy, ClusterRoom, EpisodeSpec, TenantConfig
from workers.temporal import workflow_runner
from workflows.admission import (
    ADMISSION_WORKFLOW_ID,
    Admission,
    AdmissionDecision,
    AdmissionWorkflow,
    TenantUsage,
)

pytestmark = pytest.mark.integration


class StandInInput(BaseModel):
    spec: EpisodeSpec
    policy: AdmissionPolicy


class StandInStatus(BaseModel):
    state: str
    reason: str = ""


@workflow.defn
class StandInEpisode:
    @workflow.init
    def __init__(self, input: StandInInput) -> None:
        self._admission = Admission()
        self._status = StandInStatus(state="pending")
        self._finish = False

    @workflow.run
    async def run(self, input: StandInInput) -> str:
        try:
            await self._admission.admit(input.spec, input.policy, on_wait=self._waiting)
            self._status = StandInStatus(state="running")
            await workflow.wait_condition(lambda: self._finish)
        except GeneratorExit:  # evicted from the cache: no workflow call from here
            raise
        except BaseException:
            await self._admission.release()
            raise
        await self._admission.release()
        return "done"

    def _waiting(self, reason: str) -> None:
        self._status = StandInStatus(state="waiting", reason=reason)

    @workflow.signal(name="admission")
    def admission(self, decision: AdmissionDecision) -> None:
        self._admission.decided(decision)

    @workflow.signal
    def finish(self) -> None:
        self._finish = True

    @workflow.query
    def status(self) -> StandInStatus:
        return self._status


QUEUE = f"elastic-admission-{uuid.uuid4().hex[:8]}"


@pytest_asyncio.fixture(scope="module")
async def client(temporal_env: WorkflowEnvironment) -> AsyncIterator[Client]:
    async with Worker(
        temporal_env.client,
        task_queue=QUEUE,
        workflows=[StandInEpisode, AdmissionWorkflow],
        workflow_runner=workflow_runner(),
    ):
        yield temporal_env.client


async def _start(client: Client, tenant: str, quota: TenantConfig, **spec: object) -> str:
    episode_id = f"{tenant}-{uuid.uuid4().hex[:8]}"
    room = spec.pop("room", None)
    policy = AdmissionPolicy(tenant=quota, cluster=room or ClusterRoom())
    request = StandInInput(
        spec=EpisodeSpec.model_validate({"image": "busybox", "tenant": tenant, **spec}),
        policy=policy,
    )
    await client.start_workflow(StandInEpisode.run, request, id=episode_id, task_queue=QUEUE)
    return episode_id


async def _status(client: Client, episode_id: str) -> StandInStatus:
    status: StandInStatus = await client.get_workflow_handle(episode_id).query(
        StandInEpisode.status
    )
    return status


async def _until_state(client: Client, episode_id: str, state: str) -> StandInStatus:
    deadline = time.monotonic() + 30
    while (status := await _status(client, episode_id)).state != state:
        assert time.monotonic() < deadline, f"{episode_id} stayed {status}, never {state}"
        await asyncio.sleep(0.1)
    return status


async def _finish(client: Client, episode_id: str) -> None:
    handle = client.get_workflow_handle(episode_id)
    await handle.signal(StandInEpisode.finish)
    assert await handle.result() == "done"


async def _until_usage(client: Client, tenant: str, *, episodes: int, waiting: int) -> None:
    """A closed episode's release is a signal the admission workflow handles a moment later."""
    deadline = time.monotonic() + 30
    while ((usage := await _usage(client, tenant)).episodes, usage.waiting) != (episodes, waiting):
        assert time.monotonic() < deadline, f"usage stayed {usage}"
        await asyncio.sleep(0.1)


async def _usage(client: Client, tenant: str) -> TenantUsage:
    rows: list[TenantUsage] = await client.get_workflow_handle(ADMISSION_WORKFLOW_ID).query(
        AdmissionWorkflow.usage
    )
    return next(row for row in rows if row.tenant == tenant)


async def test_an_episode_over_quota_waits_with_the_reason_then_starts(client: Client) -> None:
    tenant, quota = f"q{uuid.uuid4().hex[:6]}", TenantConfig(max_episodes=1)
    first = await _start(client, tenant, quota)
    await _until_state(client, first, "running")
    second = await _start(client, tenant, quota)
    waiting = await _until_state(client, second, "waiting")
    assert waiting.reason == f"tenant '{tenant}' is at its quota of 1 concurrent episodes"
    usage = await _usage(client, tenant)
    assert (usage.episodes, usage.waiting) == (1, 1)
    await _finish(client, first)
    await _until_state(client, second, "running")
    await _finish(client, second)
    await _until_usage(client, tenant, episodes=0, waiting=0)


async def test_on_quota_reject_fails_the_episode_naming_the_quota(client: Client) -> None:
    tenant = f"r{uuid.uuid4().hex[:6]}"
    quota = TenantConfig(cpu_cores=1, on_quota="reject")
    first = await _start(client, tenant, quota)
    await _until_state(client, first, "running")
    second = await _start(client, tenant, quota, resources={"cpu_cores": 0.5})
    with pytest.raises(WorkflowFailureError) as failed:
        await client.get_workflow_handle(second).result()
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "EpisodeRejected"
    assert cause.message == (
        f"episode rejected: tenant '{tenant}' is at its quota of 1 cpu_cores (1 in use, 0.5 asked)"
    )
    await _finish(client, first)


async def test_a_spec_breaking_a_rule_is_rejected_by_admission_too(client: Client) -> None:
    tenant = f"i{uuid.uuid4().hex[:6]}"
    quota = TenantConfig(max_episodes=5, images=["corral.local/*"])
    episode = await _start(client, tenant, quota)
    with pytest.raises(WorkflowFailureError) as failed:
        await client.get_workflow_handle(episode).result()
    assert f"tenant '{tenant}' does not allow image 'busybox'" in str(failed.value.cause)


async def test_two_tenants_share_the_room_in_fair_order(client: Client) -> None:
    suffix = uuid.uuid4().hex[:6]
    room = ClusterRoom(episodes=1)
    quota = TenantConfig(max_episodes=10)
    # Room for one episode with a quota at a time, shared by both tenants.
    first = await _start(client, f"a{suffix}", quota, room=room)
    await _until_state(client, first, "running")
    queued = []
    for _ in range(3):
        queued.append(await _start(client, f"a{suffix}", quota, room=room))
        await _until_state(client, queued[-1], "waiting")
        queued.append(await _start(client, f"b{suffix}", quota, room=room))
        await _until_state(client, queued[-1], "waiting")
    order, running = [], first
    for _ in range(len(queued)):
        await _finish(client, running)
        running = await _next_running(client, queued)
        queued.remove(running)
        order.append(running[0])
    await _finish(client, running)
    assert order == ["b", "a", "b", "a", "b", "a"]


async def _next_running(client: Client, candidates: list[str]) -> str:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        states = {e: (await _status(client, e)).state for e in candidates}
        running = [e for e, state in states.items() if state == "running"]
        if running:
            assert len(running) == 1, f"two started in a room for one: {running}"
            return running[0]
        await asyncio.sleep(0.1)
    raise AssertionError("no waiting episode started")


async def test_a_waiting_episode_that_was_terminated_gives_its_turn_away(client: Client) -> None:
    tenant, quota = f"t{uuid.uuid4().hex[:6]}", TenantConfig(max_episodes=1)
    first = await _start(client, tenant, quota)
    await _until_state(client, first, "running")
    gone = await _start(client, tenant, quota)
    third = await _start(client, tenant, quota)
    await _until_state(client, gone, "waiting")
    await _until_state(client, third, "waiting")
    # Terminated: no workflow code runs, so it never releases; admission finds it gone.
    await client.get_workflow_handle(gone).terminate("test")
    await _finish(client, first)
    await _until_state(client, third, "running")
    await _finish(client, third)
    await _until_usage(client, tenant, episodes=0, waiting=0)


async def test_tenant_list_shows_use_against_the_configured_quota(
    client: Client, tmp_path: Path
) -> None:
    tenant, quota = f"l{uuid.uuid4().hex[:6]}", TenantConfig(max_episodes=1, weight=2)
    running = await _start(client, tenant, quota)
    await _until_state(client, running, "running")
    waiting = await _start(client, tenant, quota)
    await _until_state(client, waiting, "waiting")
    config = tmp_path / "corral.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "state_dir": str(tmp_path / "state"),
                "temporal": {
                    "address": client.service_client.config.target_host,
                    "namespace": client.namespace,
                },
                "tenants": {tenant: {"max_episodes": 1, "weight": 2}, "idle": {"cpu_cores": 4}},
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    listed = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "corral", "--config", str(config), "tenant", "list", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    rows = {row["tenant"]: row for row in json.loads(listed.stdout)}
    mine, idle = rows[tenant], rows["idle"]
    assert (mine["episodes"], mine["waiting"], mine["quota"]["max_episodes"]) == (1, 1, 1)
    assert (idle["episodes"], idle["waiting"], idle["quota"]["cpu_cores"]) == (0, 0, 4)
    await _finish(client, running)
    await _until_state(client, waiting, "running")
    await _finish(client, waiting)
