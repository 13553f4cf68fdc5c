"""A node admits sandboxes only within its budget (real containerd)."""

from __future__ import annotations

from pathlib import Path

import pytest
from elastic_helpers import provision_input
from temporalio.exceptions import ApplicationError

from activities.capacity import node_capacity
from activities.node import NodeActivities
from contract.models import EpisodeSpec, NodeCapacity, Resources, TeardownInput
from sandbox import Containerd

pytestmark = pytest.mark.integration

ROOMY = node_capacity()


def _node(containerd: Containerd, tmp_path: Path, **budget: float) -> NodeActivities:
    capacity = ROOMY.model_copy(update=budget)
    return NodeActivities("budget-test", containerd, tmp_path, capacity=capacity)


async def test_idle_sandboxes_are_admitted_past_their_nominal_cores(
    elastic_containerd: Containerd, tmp_path: Path
) -> None:
    # Three sandboxes of 1.5 cores each on a 1-core node: 4.5 nominal cores, but
    # idle, so admission (by use, not ceilings) takes them all.
    node = _node(elastic_containerd, tmp_path, cores=1)
    spec = EpisodeSpec(image="busybox", resources=Resources(cpu_cores=1.5))
    made = []
    try:
        for _ in range(3):
            made.append((await node.provision(provision_input(spec))).sandbox_id)
        use = await node.use()
        assert (use.sandboxes, use.cpu_cores, use.admitting) == (3, 4.5, True)
        assert use.disk_free_mb is not None and use.disk_free_mb > 0
    finally:
        for sandbox_id in made:
            await node.teardown(TeardownInput(sandbox_id=sandbox_id))
    assert (await node.use()).sandboxes == 0


async def test_sandbox_count_memory_and_pids_budgets_refuse_with_their_reason(
    elastic_containerd: Containerd, tmp_path: Path
) -> None:
    spec = EpisodeSpec(image="busybox")
    cases = {
        "sandbox budget of 0": {"max_sandboxes": 0},
        "memory budget of 64 MiB is used up": {"memory_mb": 64},
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
