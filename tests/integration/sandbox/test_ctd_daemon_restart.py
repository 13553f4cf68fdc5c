"""A second, private containerd: stale sockets, restarts, event re-subscription."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from pathlib import Path

import pytest

from contract.errors import ContainerdUnavailable
from sandbox.client import Containerd
from sandbox.daemon import ContainerdDaemon
from sandbox.models import SandboxEvent, SandboxSpec
from sandbox.oci_archive import build_busybox_image
from sandbox.sandbox import Sandbox

pytestmark = pytest.mark.integration


async def test_start_over_stale_socket(tmp_path: Path) -> None:
    daemon = ContainerdDaemon(tmp_path / "d")
    daemon.root_dir.mkdir()
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(daemon.socket)  # a socket file nobody listens on
    stale.close()
    try:
        await daemon.start()
        assert daemon.is_running()
        async with await Containerd.connect(daemon.socket) as client:
            assert await client.version()
    finally:
        await daemon.stop(kill_shims=True)
    assert not daemon.is_running()


async def _eventually_status(sandbox: Sandbox) -> str:
    """The client's channel reconnects on its own; give it a few tries."""
    for _ in range(50):
        with contextlib.suppress(ContainerdUnavailable):
            return await sandbox.status()
        await asyncio.sleep(0.1)
    return await sandbox.status()


async def test_events_resubscribe_after_restart(tmp_path: Path) -> None:
    daemon = ContainerdDaemon(tmp_path / "r")
    await daemon.start()
    client = await Containerd.connect(daemon.socket, namespace="restart-test")
    events: asyncio.Queue[SandboxEvent] = asyncio.Queue()

    async def collect() -> None:
        async for event in client.events(("/tasks/exit",)):
            await events.put(event)

    collector = asyncio.ensure_future(collect())
    try:
        await build_busybox_image(client)
        sandbox = await client.create_sandbox("survivor", SandboxSpec(image="busybox"))
        await daemon.stop()  # shims and the sandbox survive
        await daemon.start()
        assert await _eventually_status(sandbox) == "running"
        while not events.empty():
            events.get_nowait()
        for _ in range(50):  # the new subscription may take a moment to land
            await sandbox.exec("true")
            with contextlib.suppress(TimeoutError):
                event = await asyncio.wait_for(events.get(), 0.5)
                assert event.sandbox_id == "survivor" and event.exec_id
                break
        else:
            pytest.fail("no /tasks/exit event after containerd restarted")
        assert await client.destroy_sandbox("survivor")
    finally:
        collector.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await collector
        with contextlib.suppress(ContainerdUnavailable):
            await client.destroy_sandbox("survivor")
        await client.close()
        await daemon.stop(kill_shims=True)
