"""A snapshot pushed to the configured registry is pulled by a node that lacks it.

The snapshot activity runs here in-process against node-1's containerd (the
stack's node workers have no registry configured); the episode started from
the pushed ref on node-2 pulls it on first use like any registry image.
"""

from __future__ import annotations

import os

import pytest
from episode_helpers import sandbox_exists
from registry_helpers import RegistryServer

from activities.snapshots import SnapshotActivities
from contract.config import StackConfig
from contract.models import SnapshotInput
from corral.sdk import Corral
from sandbox import Containerd
from sandbox.registry import RegistryOptions

pytestmark = pytest.mark.integration


async def test_snapshot_pushed_to_the_registry_starts_on_a_node_without_it(
    corral: Corral, stack_config: StackConfig, open_registry: RegistryServer
) -> None:
    source = await corral.start_episode({"image": "busybox", "interactive": True}, node="node-1")
    await source.write_file("/work/state.txt", "pushed\n")
    status = await source.status()
    async with await Containerd.connect(
        str(stack_config.containerd_socket("node-1")),
        namespace=stack_config.nodes.containerd_namespace,
    ) as node_1:
        activities = SnapshotActivities(
            "node-1", node_1, {}, registry=open_registry.host, registry_options=RegistryOptions()
        )
        snap = await activities.snapshot(
            SnapshotInput(
                sandbox_id=status.sandbox_id,
                ref=f"corral/snapshots/push-{os.getpid()}:one",
                episode_id=source.id,
            )
        )
    assert snap.ref == f"{open_registry.host}/corral/snapshots/push-{os.getpid()}:one"

    restored = await corral.start_episode({"image": snap.ref, "interactive": True}, node="node-2")
    assert await restored.read_file("/work/state.txt") == b"pushed\n"
    for episode in (restored, source):
        result = await episode.finish()
        assert not await sandbox_exists(stack_config, result.sandbox_id)
