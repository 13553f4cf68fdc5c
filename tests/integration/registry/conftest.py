"""A real OCI registry (Debian's `docker-registry`) for the registry tests.

Two servers per session on free loopback ports, each with its own storage in
a temp dir: one anonymous, one behind htpasswd (bcrypt) basic auth. Images are
the tests' own: busybox built by `sandbox.oci_archive` and pushed with
`sandbox.transfer.push_image`. Pulls go into node-2's containerd of the
session stack (tests/integration/conftest.py), whose leak check runs at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
from registry_helpers import RegistryServer

from contract.config import StackConfig
from contract.errors import ImageNotFound
from sandbox import Containerd
from sandbox.models import ImageInfo
from sandbox.oci_archive import build_busybox_image
from sandbox.registry import Credentials, RegistryOptions
from tests.net import free_port
from workers.stack import Stack

BUSYBOX = "corral.local/registry-tests-busybox:latest"
START_TIMEOUT_S = 30.0

pytestmark = pytest.mark.integration


def _config(root: Path, port: int, htpasswd: Path | None) -> str:
    auth = (
        f"auth:\n  htpasswd:\n    realm: corral-tests\n    path: {htpasswd}\n" if htpasswd else ""
    )
    return (
        "version: 0.1\nlog:\n  level: warn\n"
        f"storage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n  delete:\n"
        "    enabled: true\n"
        f"http:\n  addr: 127.0.0.1:{port}\n  secret: {secrets.token_hex(16)}\n{auth}"
    )


async def _wait_until_serving(host: str, process: subprocess.Popen[bytes]) -> None:
    """Up when /v2/ answers at all (200 anonymous, 401 with auth)."""
    deadline = asyncio.get_running_loop().time() + START_TIMEOUT_S
    async with aiohttp.ClientSession() as http:
        while asyncio.get_running_loop().time() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"docker-registry exited with {process.returncode}")
            try:
                async with http.get(f"http://{host}/v2/") as resp:
                    if resp.status in (200, 401):
                        return
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"docker-registry on {host} did not answer in {START_TIMEOUT_S:g} s")


def _htpasswd(path: Path, credentials: Credentials) -> None:
    line = subprocess.run(
        ["htpasswd", "-Bbn", credentials.username, credentials.password],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    path.write_text(line + "\n")


async def _start(root: Path, credentials: Credentials | None) -> RegistryServer:
    if shutil.which("docker-registry") is None or shutil.which("htpasswd") is None:
        pytest.skip("needs docker-registry and htpasswd (scripts/setup.sh installs them)")
    root.mkdir(parents=True, exist_ok=True)
    htpasswd = None
    if credentials is not None:
        htpasswd = root / "htpasswd"
        _htpasswd(htpasswd, credentials)
    port = free_port()
    config = root / "config.yml"
    config.write_text(_config(root, port, htpasswd))
    log = (root / "registry.log").open("wb")
    process = subprocess.Popen(
        ["docker-registry", "serve", str(config)], stdout=log, stderr=subprocess.STDOUT
    )
    log.close()
    server = RegistryServer(f"localhost:{port}", root / "data", process, credentials)
    try:
        await _wait_until_serving(server.host, process)
    except BaseException:
        _stop(server)
        raise
    return server


def _stop(server: RegistryServer) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


@pytest_asyncio.fixture(scope="session")
async def open_registry(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RegistryServer]:
    server = await _start(tmp_path_factory.mktemp("registry-open"), None)
    try:
        yield server
    finally:
        _stop(server)


@pytest_asyncio.fixture(scope="session")
async def auth_registry(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RegistryServer]:
    credentials = Credentials("trainer", secrets.token_urlsafe(12))
    server = await _start(tmp_path_factory.mktemp("registry-auth"), credentials)
    try:
        yield server
    finally:
        _stop(server)


@pytest.fixture(scope="session")
def options() -> RegistryOptions:
    return RegistryOptions()  # localhost is plain HTTP by default


async def _node_client(config: StackConfig, node: str) -> AsyncIterator[Containerd]:
    async with await Containerd.connect(
        str(config.containerd_socket(node)), namespace=config.nodes.containerd_namespace
    ) as client:
        yield client


@pytest_asyncio.fixture(scope="session")
async def node1(stack: Stack, stack_config: StackConfig) -> AsyncIterator[Containerd]:
    """node-1's containerd of the session stack: where the pushed images are built."""
    async for client in _node_client(stack_config, "node-1"):
        yield client


@pytest_asyncio.fixture(scope="session")
async def node2(stack: Stack, stack_config: StackConfig) -> AsyncIterator[Containerd]:
    """node-2's containerd: the node that pulls what node-1 pushed."""
    async for client in _node_client(stack_config, "node-2"):
        yield client


@pytest_asyncio.fixture(scope="session")
async def busybox_local(node1: Containerd) -> ImageInfo:
    """busybox built here, the image the tests push."""
    return await build_busybox_image(node1, BUSYBOX)


@pytest_asyncio.fixture
async def pulled(node2: Containerd) -> AsyncIterator[list[str]]:
    """Image names a test pulls into node-2; removed when it ends, pass or fail."""
    names: list[str] = []
    yield names
    for name in names:
        with contextlib.suppress(ImageNotFound):
            await node2.images.remove(name)
