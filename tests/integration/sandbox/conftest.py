"""Session fixtures for the sandbox layer's integration tests.

One private containerd (ContainerdDaemon in a temp dir) and one connected
client for the whole session; busybox is built and imported once. At the end
the session FAILS if any container, task, active snapshot, shim, workspace
volume or network attachment is left in the test namespace, then stops the daemon.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from sandbox import network, volumes
from sandbox.client import Containerd
from sandbox.daemon import ContainerdDaemon
from sandbox.models import ImageInfo, SandboxSpec
from sandbox.oci_archive import build_busybox_image
from sandbox.sandbox import Sandbox

TEST_NAMESPACE = "corral-sandbox-tests"
SHIM_EXIT_WAIT_S = 10.0

needs_containerd = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("containerd") is None or shutil.which("runc") is None,
    reason="needs root, containerd and runc",
)

MakeSandbox = Callable[..., Awaitable[Sandbox]]


@pytest.fixture(scope="session")
async def ctd_daemon(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ContainerdDaemon]:
    if os.geteuid() != 0 or shutil.which("containerd") is None:
        pytest.skip("needs root and containerd")
    daemon = ContainerdDaemon(tmp_path_factory.mktemp("ctd"))
    await daemon.start()
    try:
        yield daemon
    finally:
        await daemon.stop(kill_shims=True)


@pytest.fixture(scope="session")
async def ctd(ctd_daemon: ContainerdDaemon) -> AsyncIterator[Containerd]:
    client = await Containerd.connect(ctd_daemon.socket, namespace=TEST_NAMESPACE)
    try:
        yield client
        await _assert_nothing_left(client, ctd_daemon)
    finally:
        await client.close()


@pytest.fixture(scope="session")
async def busybox(ctd: Containerd) -> ImageInfo:
    return await build_busybox_image(ctd)


@pytest.fixture
async def make_sandbox(ctd: Containerd, busybox: ImageInfo) -> AsyncIterator[MakeSandbox]:
    """Create sandboxes for one test; all of them are destroyed when it ends, pass or fail."""
    made: list[str] = []

    async def make(sandbox_id: str | None = None, **spec_fields: object) -> Sandbox:
        sandbox_id = sandbox_id or f"t-{uuid.uuid4().hex[:10]}"
        made.append(sandbox_id)
        spec = SandboxSpec.model_validate({"image": busybox.name, **spec_fields})
        return await ctd.create_sandbox(sandbox_id, spec)

    try:
        yield make
    finally:
        for sandbox_id in made:
            await ctd.destroy_sandbox(sandbox_id)


async def _assert_nothing_left(client: Containerd, daemon: ContainerdDaemon) -> None:
    leftovers = {
        "containers": await client.container_ids(),
        "tasks": await client.task_ids(),
        "active snapshots": await client.snapshot_keys(active_only=True),
    }
    # a shim exits shortly after its last task is deleted
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SHIM_EXIT_WAIT_S
    while daemon.shim_pids() and loop.time() < deadline:
        await asyncio.sleep(0.1)
    leftovers["shims"] = [str(pid) for pid in daemon.shim_pids()]
    leftovers["workspaces"] = volumes.list_workspaces(client.workspace_root)
    leftovers["network attachments"] = [
        att.sandbox_id for att in await network.list_attachments(client.network_state_dir)
    ]
    left = {kind: items for kind, items in leftovers.items() if items}
    if left:
        pytest.fail(f"sandbox tests leaked resources in {TEST_NAMESPACE!r}: {left}", pytrace=False)
