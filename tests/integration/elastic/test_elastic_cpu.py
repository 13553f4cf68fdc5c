"""Elastic CPU on a real containerd: a sandbox's weight follows its steps.

The weight is read from the sandbox's cgroup (cpu.shares), on the host and
from inside the step itself (the sandbox sees its own cgroup at /sys/fs/cgroup).
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from elastic_helpers import provision_input

from activities.node import NodeActivities
from contract.models import (
    EpisodeSpec,
    ExecStepInput,
    ReadFileInput,
    ReadFileRequest,
    Resources,
    Step,
    TeardownInput,
    WriteFileInput,
    WriteFileRequest,
)
from sandbox import Containerd
from sandbox.cgroups import IDLE_SHARES, read_shares
from tests.integration.conftest import wait_for

pytestmark = pytest.mark.integration

# The step reads its own cgroup's weight (runc mounts the sandbox's cgroups there).
OWN_SHARES = "cat /sys/fs/cgroup/cpu/cpu.shares"


@pytest_asyncio.fixture
async def node(elastic_containerd: Containerd, tmp_path: Path) -> AsyncIterator[NodeActivities]:
    yield NodeActivities("elastic-test", elastic_containerd, tmp_path)


async def _provision(node: NodeActivities, resources: Resources) -> str:
    spec = EpisodeSpec(image="busybox", resources=resources)
    result = await node.provision(provision_input(spec))
    return result.sandbox_id


def _step(sandbox_id: str, cmd: str, index: int) -> ExecStepInput:
    return ExecStepInput(
        sandbox_id=sandbox_id,
        step=Step(cmd=cmd),
        index=index,
        default_timeout_s=60,
        output_limit_bytes=4096,
    )


async def test_weight_is_full_while_a_step_runs_and_minimal_between_steps(
    node: NodeActivities,
) -> None:
    sandbox_id = await _provision(node, Resources(cpu_cores=0.5))
    try:
        assert read_shares(sandbox_id) == IDLE_SHARES
        seen = await node.exec_step(_step(sandbox_id, OWN_SHARES, 0))
        assert seen.stdout.strip() == "512"  # 1024 per core of its 0.5-core ceiling
        assert read_shares(sandbox_id) == IDLE_SHARES

        long_step = asyncio.create_task(node.exec_step(_step(sandbox_id, "sleep 2", 1)))
        await wait_for(_shares_are(sandbox_id, 512), timeout_s=20)
        assert (await long_step).exit_code == 0
        assert read_shares(sandbox_id) == IDLE_SHARES
    finally:
        await node.teardown(TeardownInput(sandbox_id=sandbox_id))


async def test_file_operations_raise_the_weight_too(node: NodeActivities) -> None:
    sandbox_id = await _provision(node, Resources(cpu_cores=1))
    try:
        content = base64.b64encode(b"hello").decode()
        write = WriteFileRequest(path="/tmp/a.txt", content_b64=content)
        await node.write_file(WriteFileInput(sandbox_id=sandbox_id, request=write))
        assert read_shares(sandbox_id) == IDLE_SHARES
        # A step overlapping a read keeps the full weight until the last one ends.
        step = asyncio.create_task(node.exec_step(_step(sandbox_id, "sleep 3", 0)))
        await wait_for(_shares_are(sandbox_id, 1024), timeout_s=20)
        read = ReadFileInput(sandbox_id=sandbox_id, request=ReadFileRequest(path="/tmp/a.txt"))
        got = await node.read_file(read)
        assert base64.b64decode(got.content_b64) == b"hello"
        assert read_shares(sandbox_id) == 1024 or step.done()
        await step
        assert read_shares(sandbox_id) == IDLE_SHARES
    finally:
        await node.teardown(TeardownInput(sandbox_id=sandbox_id))


async def test_a_hard_quota_keeps_its_full_weight(node: NodeActivities) -> None:
    sandbox_id = await _provision(node, Resources(cpu_cores=2, hard_cpu_quota=True))
    try:
        assert read_shares(sandbox_id) == 2048
        seen = await node.exec_step(_step(sandbox_id, OWN_SHARES, 0))
        assert seen.stdout.strip() == "2048"
        assert read_shares(sandbox_id) == 2048
    finally:
        await node.teardown(TeardownInput(sandbox_id=sandbox_id))


def _shares_are(sandbox_id: str, shares: int) -> object:
    async def check() -> bool:
        return read_shares(sandbox_id) == shares

    return check
