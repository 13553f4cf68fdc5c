"""A node admits sandboxes only within its budget (real containerd)."""

from __future__ import annotations

from pathlib import Path

import pytest
from elastic_helpers import provision_input
from temporalio.exceptions import ApplicationError

from activities.capacity import node_capacity
from activities.models import EpisodeSpec, NodeCapacity, Resources, TeardownInput
from activities.node import NodeActivities
from sandbox import Containerd

pytestmark = pytest.mark.integration

ROOMY = node_capacity()


def _node(containerd: Containerd, tmp_path: Path, **budget: float) -> NodeActivities:
    capacity = ROOMY.model_copy(update=budget)
    return NodeActivities("budget-test", containerd, tmp_path, capacity=capacity)


async def test_cpu_is_overcommitted_up_to_the_budget_and_no_further(
    elastic_containerd: Containerd, tmp_path: Path
) -> None:
    node = _node(elastic_containerd, tmp_path, cores=1, overcommit=2)  # 2 nominal cores
    spec = EpisodeSpec(image="busybox", resources=Resources(cpu_cores=1.5))
    first = await node.provision(provision_input(spec))
    try:
        assert (await node.use()).cpu_cores == 1.5
        second = provision_input(spec)
        with pytest.raises(ApplicationError) as refused:
            await node.provision(second)
        assert refused.value.type == "NodeFull" and refused.value.non_retryable
        assert "cpu budget of 2 cores (1 x 2)" in str(refused.value)
        assert second.sandbox_id not in await elastic_containerd.container_ids()
        assert (await node.use()).sandboxes == 1
    finally:
        await node.teardown(TeardownInput(sandbox_id=first.sandbox_id))
    # Room again once the first one is gone.
    third = await node.provision(provision_input(spec))
    await node.teardown(TeardownInput(sandbox_id=third.sandbox_id))
    assert (await node.use()).sandboxes == 0


async def test_sandbox_count_memory_and_pids_budgets_refuse_with_their_reason(
    elastic_containerd: Containerd, tmp_path: Path
) -> None:
    spec = EpisodeSpec(image="busybox")
    cases = {
        "sandbox budget of 0": {"max_sandboxes": 0},
        "memory budget of 64 MiB": {"memory_mb": 64},
        "pids budget of 64": {"pids": 64},
    }
    for reason, budget in cases.items():
        node = _node(elastic_containerd, tmp_path, **budget)
        with pytest.raises(ApplicationError, match=reason) as refused:
            await node.provision(provision_input(spec))
        assert refused.value.type == "NodeFull"
    assert await elastic_containerd.container_ids() == []


def test_default_capacity_comes_from_the_machine() -> None:
    capacity = node_capacity()
    assert isinstance(capacity, NodeCapacity)
    assert capacity.cores >= 1 and capacity.overcommit == 50
    assert 0 < capacity.memory_mb < 1024 * 1024 and 0 < capacity.pids < 4_194_304
    assert capacity.max_sandboxes > 0
