"""The isolated rig for fleet tests: 3 nodes, each in its own network namespace.

`corral up --nodes 3 --isolated` on its own ports and state directory: the
control plane (Temporal, workflow worker, intake over TLS) in the root
namespace, each node's containerd, node worker and sensor in a namespace of
its own that reaches the control plane only over the rig's bridge. The
session stack of tests/integration/conftest.py (2 nodes, not isolated) is
left alone; both may run in one session.

Ports are pinned in the stack file (not the environment, which the session
stack's children inherit), so the rig's processes never pick up the session
stack's settings. At the end the rig is stopped and the run FAILS if any
sandbox, shim, namespace or veth is left behind.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from contract.config import StackConfig, load_config
from corral.sdk import Corral
from tests.integration.conftest import sandboxes_left
from workers.netns import Rig
from workers.stack import Stack

REPO = Path(__file__).resolve().parents[3]
FLEET_NODES = 3
# A port family of its own, above the session stacks' (17233..20560 + offset).
_OFFSET = int(os.environ.get("CORRAL_TEST_PORT_OFFSET", "0"))


def fleet_overrides(offset: int) -> dict[str, dict[str, object]]:
    return {
        "temporal": {
            "address": f"127.0.0.1:{21233 + offset}",
            "dev_server": {"ui_port": 22233 + offset, "metrics_port": 23233 + offset},
        },
        "workers": {"metrics_port_base": 23460 + offset, "warm_pool": ""},  # no pool
        "intake": {"port": 22765 + offset},
        "nodes": {"count": FLEET_NODES, "isolated": True},
        "observability": {"traces": "file"},
    }


@pytest.fixture(scope="session")
def fleet_config() -> Iterator[StackConfig]:
    state = Path(tempfile.mkdtemp(prefix="corral-fleet-", dir="/tmp"))
    stack_file = {"nodes": FLEET_NODES, "role": "all", "overrides": fleet_overrides(_OFFSET)}
    (state / "stack.json").write_text(json.dumps(stack_file))
    yield load_config(REPO / "temporal-dev.yaml", env={"CORRAL_STATE_DIR": str(state)})


@pytest_asyncio.fixture(scope="session")
async def fleet(fleet_config: StackConfig) -> AsyncIterator[Stack]:
    stack = Stack(fleet_config)
    rig = Rig.for_state(fleet_config.state)
    try:
        await stack.up()
        yield stack
        leftovers = await sandboxes_left(stack.config)
    finally:
        await stack.down()
    shims = [pid for node in stack.config.node_names() for pid in stack.daemon(node).shim_pids()]
    assert not leftovers, f"fleet tests left sandboxes behind: {leftovers}"
    assert not shims, f"containerd shims still running after down: {shims}"
    assert not rig.nodes(), f"network namespaces left behind: {rig.nodes()}"


@pytest_asyncio.fixture(scope="session")
async def fleet_corral(fleet: Stack) -> AsyncIterator[Corral]:
    async with await Corral.connect(fleet.config) as client:
        yield client
