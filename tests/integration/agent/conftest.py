"""Fixtures for the exec agent's integration tests (docs/agent.md).

The agent is on by default (``workers.exec_agent``); these tests make their own
sandboxes with it all the same, so they test the sandbox layer whatever the
stack runs: a ``Containerd`` client with ``exec_agent=True`` on the stack's
first node, in a namespace of its own (the node worker neither sees nor reaps
them). Every
sandbox is destroyed when its test ends, and the session fails if any is left.
"""

from __future__ import annotations

import importlib.util
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from sandbox.agent import agent_binary
from sandbox.client import Containerd
from sandbox.models import ImageInfo, SandboxSpec
from sandbox.oci_archive import build_busybox_image
from sandbox.sandbox import Sandbox
from workers.stack import Stack

AGENT_NAMESPACE = "corral-agent-tests"
_INTEGRATION = Path(__file__).resolve().parents[1]


def _registry_fixtures() -> object:
    """The registry tests' conftest (a real docker-registry on a loopback port), loaded
    under its own name, as tests/integration/fork does: large files travel through it."""
    sys.path.insert(0, str(_INTEGRATION / "registry"))
    spec = importlib.util.spec_from_file_location(
        "agent_registry_fixtures", _INTEGRATION / "registry" / "conftest.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


open_registry = _registry_fixtures().open_registry  # type: ignore[attr-defined]

MakeSandbox = Callable[..., Awaitable[Sandbox]]


@pytest.fixture(scope="session")
async def agent_ctd(stack: Stack) -> AsyncIterator[Containerd]:
    if not agent_binary().is_file():
        pytest.skip(f"no exec agent at {agent_binary()} (scripts/setup.sh builds it)")
    node = stack.config.node_names()[0]
    client = await Containerd.connect(
        str(stack.config.containerd_socket(node)), namespace=AGENT_NAMESPACE, exec_agent=True
    )
    try:
        yield client
        left = await client.container_ids() + await client.task_ids()
        assert not left, f"agent tests left sandboxes behind: {left}"
    finally:
        await client.close()


@pytest.fixture(scope="session")
async def agent_busybox(agent_ctd: Containerd) -> ImageInfo:
    return await build_busybox_image(agent_ctd)


@pytest.fixture
async def make_agent_sandbox(
    agent_ctd: Containerd, agent_busybox: ImageInfo
) -> AsyncIterator[MakeSandbox]:
    """Sandboxes whose PID 1 is the agent; all destroyed when the test ends, pass or fail."""
    made: list[str] = []

    async def make(**spec_fields: object) -> Sandbox:
        sandbox_id = f"agent-{uuid.uuid4().hex[:10]}"
        made.append(sandbox_id)
        spec = SandboxSpec.model_validate({"image": agent_busybox.name, **spec_fields})
        sandbox = await agent_ctd.create_sandbox(sandbox_id, spec)
        assert sandbox.agent() is not None, "the sandbox has no agent channel"
        return sandbox

    try:
        yield make
    finally:
        for sandbox_id in made:
            await agent_ctd.destroy_sandbox(sandbox_id)
