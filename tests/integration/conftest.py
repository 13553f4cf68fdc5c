"""The real stack for integration tests, started once per test session.

It runs on its own ports and in its own state directory, so a developer's
`corral up` stack on the default ports is left alone. At the end of the
session the stack is stopped and the run FAILS if any test sandbox, snapshot
or shim is left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from contract.config import StackConfig, load_config
from corral.sdk import Corral
from sandbox import Containerd
from workers.stack import Stack

REPO = Path(__file__).resolve().parents[2]

# Shift every port with CORRAL_TEST_PORT_OFFSET to run two suites side by side.
_OFFSET = int(os.environ.get("CORRAL_TEST_PORT_OFFSET", "0"))

TEST_ENV = {
    "CORRAL_TEMPORAL_ADDRESS": f"127.0.0.1:{17233 + _OFFSET}",
    "CORRAL_TEMPORAL_UI_PORT": str(18233 + _OFFSET),
    "CORRAL_TEMPORAL_METRICS_PORT": str(19233 + _OFFSET),
    "CORRAL_METRICS_PORT_BASE": str(19460 + _OFFSET),
    "CORRAL_INTAKE_PORT": str(18765 + _OFFSET),
    "CORRAL_NODES": os.environ.get("CORRAL_TEST_NODES", "2"),
    "CORRAL_TRACES": "file",
    # No warm pool: sandbox ids stay derived from workflow ids, and the leak
    # check sees only what tests made. tests/integration/pool tests the pool.
    "CORRAL_WARM_POOL": "",
}


@pytest.fixture(scope="session")
def stack_config() -> Iterator[StackConfig]:
    state = Path(tempfile.mkdtemp(prefix="corral-test-", dir="/tmp"))
    env = {**TEST_ENV, "CORRAL_STATE_DIR": str(state)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the stack's child processes inherit these
    try:
        yield load_config(REPO / "temporal-dev.yaml")
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest_asyncio.fixture(scope="session")
async def stack(stack_config: StackConfig) -> AsyncIterator[Stack]:
    stack = Stack(stack_config)
    try:
        await stack.up()
        yield stack
        leftovers = await _sandboxes_left_settled(stack_config)
    finally:
        await stack.down()
    shims = [pid for node in stack_config.node_names() for pid in stack.daemon(node).shim_pids()]
    assert not leftovers, f"tests left sandboxes behind: {leftovers}"
    assert not shims, f"containerd shims still running after down: {shims}"


async def _sandboxes_left_settled(
    config: StackConfig, wait_s: float = 30.0
) -> dict[str, list[str]]:
    """What containerd still holds once deferred teardowns have had their time:
    a lean run's sandbox goes a moment after its episode returns (activities/foreground.py)."""

    async def none_left() -> bool:
        return not await sandboxes_left(config)

    with contextlib.suppress(AssertionError):
        await wait_for(none_left, timeout_s=wait_s)
    return await sandboxes_left(config)


async def sandboxes_left(config: StackConfig) -> dict[str, list[str]]:
    """Containers, tasks and active snapshots still held by each node's containerd."""
    left: dict[str, list[str]] = {}
    for node in config.node_names():
        async with await Containerd.connect(
            str(config.containerd_socket(node)), namespace=config.nodes.containerd_namespace
        ) as client:
            held = [f"container {c}" for c in await client.container_ids()]
            held += [f"task {t}" for t in await client.task_ids()]
            held += [f"snapshot {s}" for s in await client.snapshot_keys(active_only=True)]
        if held:
            left[node] = held
    return left


@pytest_asyncio.fixture(scope="session")
async def corral(stack: Stack) -> AsyncIterator[Corral]:
    async with await Corral.connect(stack.config) as client:
        yield client


def require_stack_agent(config: StackConfig) -> None:
    """Skip a test that needs the stack's own sandboxes to run the exec agent."""
    if not config.workers.exec_agent:
        pytest.skip("the stack runs with CORRAL_EXEC_AGENT=0: no exec agent (on by default)")


async def wait_for(predicate: asyncio.Future[bool] | object, timeout_s: float = 30.0) -> None:
    """Poll an async predicate until it is true (a correctness wait, not a timing check)."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await predicate():  # type: ignore[operator]
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"condition not met within {timeout_s} s")


# Debian bookworm's python3 (debootstrap, cached in CORRAL_CACHE_DIR) plus the
# `openai` package at the host's version in PYLIB (pip --target, cached): the
# model gateway's and the services' tests run real Python in their sandboxes.
PYTHON_IMAGE = "corral.local/python-openai:test"
PYLIB = "/opt/corral-py"


@pytest.fixture(scope="session")
def python_image_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import openai

    from sandbox.debian import build_debian_image, make_layer_from_dir, write_debian_archive

    cache = Path(os.environ.get("CORRAL_CACHE_DIR", REPO / ".cache"))
    built = build_debian_image(cache / "debian", ["python3"])
    pylib = cache / "pylib" / f"openai-{openai.__version__}"
    if not (pylib / "done").exists():  # the layer is the tree below `layer/`
        shutil.rmtree(pylib, ignore_errors=True)
        target = pylib / "layer" / PYLIB.lstrip("/")
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-compile", "--target"]
        subprocess.run([*pip, str(target), f"openai=={openai.__version__}"], check=True)
        (pylib / "done").touch()
    layer = make_layer_from_dir(pylib / "layer", tmp_path_factory.mktemp("layer") / "l.tar")
    out = tmp_path_factory.mktemp("image") / "image.tar"
    return write_debian_archive(built, out, PYTHON_IMAGE, extra_layers=[layer])


@pytest_asyncio.fixture(scope="session")
async def python_image(stack: Stack, python_image_archive: Path) -> AsyncIterator[str]:
    """PYTHON_IMAGE on every node of the session stack, removed at the end."""
    config = stack.config
    for node in config.node_names():
        async with await Containerd.connect(
            str(config.containerd_socket(node)), namespace=config.nodes.containerd_namespace
        ) as client:
            await client.images.import_archive(python_image_archive)
    yield PYTHON_IMAGE
    for node in config.node_names():
        async with await Containerd.connect(
            str(config.containerd_socket(node)), namespace=config.nodes.containerd_namespace
        ) as client:
            await client.images.remove(PYTHON_IMAGE)
