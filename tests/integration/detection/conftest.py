"""A stack of the detection suite's own, with the warm pool ON (what users get).

The session stack (tests/integration/conftest.py) turns the pool off so that
sandbox ids stay derived; the detection suite must see the paths users take,
warm claims included. This stack runs on the session's ports shifted by
CORRAL_DETECTION_PORT_OFFSET (default 600), in its own state directory, with
two nodes and their sensors. The process-wide environment is changed only
while its config is read and it starts (Stack passes its children their
settings explicitly), so the session stack is unaffected.

At the end it FAILS if containerd still holds a sandbox other than the
pool's unclaimed ones (``corral.pool=warm``); `down` removes those.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from contract.config import StackConfig, load_config
from contract.labels import POOL_LABEL
from corral.sdk import Corral
from sandbox import Containerd
from tests.integration.conftest import REPO, TEST_ENV, wait_for
from workers.stack import Stack

EXTRA_OFFSET = int(os.environ.get("CORRAL_DETECTION_PORT_OFFSET", "600"))
PORT_VARS = (
    "CORRAL_TEMPORAL_UI_PORT",
    "CORRAL_TEMPORAL_METRICS_PORT",
    "CORRAL_METRICS_PORT_BASE",
    "CORRAL_INTAKE_PORT",
)
SENSOR_READY_CAP_S = 240.0  # a cap so a broken stack fails instead of hanging


def warm_env(state: Path) -> dict[str, str | None]:
    """The session's test settings, ports shifted, two nodes, the pool at its default."""
    host, port = TEST_ENV["CORRAL_TEMPORAL_ADDRESS"].rsplit(":", 1)
    env: dict[str, str | None] = {
        **TEST_ENV,
        "CORRAL_TEMPORAL_ADDRESS": f"{host}:{int(port) + EXTRA_OFFSET}",
        **{k: str(int(TEST_ENV[k]) + EXTRA_OFFSET) for k in PORT_VARS},
        "CORRAL_NODES": "2",
        "CORRAL_STATE_DIR": str(state),
        "CORRAL_WARM_POOL": None,  # unset: temporal-dev.yaml's pool (busybox: 8 per node)
        "CORRAL_CONFIG": None,
    }
    return env


@contextlib.contextmanager
def environment(env: dict[str, str | None]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in env}
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


@pytest.fixture(scope="session")
def warm_config() -> StackConfig:
    state = Path(tempfile.mkdtemp(prefix="corral-detect-", dir="/tmp"))
    with environment(warm_env(state)):
        config = load_config(REPO / "temporal-dev.yaml")
    assert config.workers.warm_pool, "the detection stack must run the default warm pool"
    assert config.sensor.enabled
    return config


@pytest_asyncio.fixture(scope="session")
async def warm_stack(warm_config: StackConfig) -> AsyncIterator[Stack]:
    stack = Stack(warm_config)
    leftovers: dict[str, list[str]] = {}
    try:
        with environment(warm_env(warm_config.state)):
            await stack.up()
        await _sensors_ready(stack)
        yield stack
        leftovers = await _claimed_left_settled(warm_config)
    finally:
        await stack.down()
    assert not leftovers, f"the detection suite left sandboxes behind: {leftovers}"


async def _sensors_ready(stack: Stack) -> None:
    config = stack.config
    deadline = time.monotonic() + SENSOR_READY_CAP_S
    waiting = list(config.node_names())
    while waiting:
        waiting = [n for n in waiting if not (config.state / "run" / f"sensor-{n}.ready").exists()]
        if waiting and time.monotonic() > deadline:
            tails = "\n".join(
                f"--- sensor-{n}:\n{stack.process(f'sensor-{n}').log_tail(15)}" for n in waiting
            )
            raise AssertionError(f"sensors not attached within {SENSOR_READY_CAP_S:g} s:\n{tails}")
        if waiting:
            import asyncio

            await asyncio.sleep(0.5)


async def claimed_left(config: StackConfig) -> dict[str, list[str]]:
    """Per node: sandboxes that are not unclaimed warm-pool sandboxes."""
    left: dict[str, list[str]] = {}
    for node in config.node_names():
        async with await Containerd.connect(
            str(config.containerd_socket(node)), namespace=config.nodes.containerd_namespace
        ) as client:
            held = [
                f"{info.id[:12]} {info.labels.get('corral.workflow_id', '')} "
                f"{info.labels.get(POOL_LABEL, '')}".strip()
                for info in await client.list_sandboxes()
                if info.labels.get(POOL_LABEL) != "warm"
            ]
        if held:
            left[node] = held
    return left


async def _claimed_left_settled(config: StackConfig, wait_s: float = 60.0) -> dict[str, list[str]]:
    """Deferred teardowns (a lean run's sandbox goes after its episode returns) get their time."""

    async def none_left() -> bool:
        return not await claimed_left(config)

    with contextlib.suppress(AssertionError):
        await wait_for(none_left, timeout_s=wait_s)
    return await claimed_left(config)


@pytest_asyncio.fixture(scope="session")
async def warm_corral(warm_stack: Stack) -> AsyncIterator[Corral]:
    async with await Corral.connect(warm_stack.config) as client:
        yield client
