"""The isolated rig as a fleet: separation, intake TLS, alerts, drain, kill and rejoin.

All on the 3-node rig of tests/integration/fleet/conftest.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from contract.errors import ContainerdUnavailable, CorralError
from contract.ids import sandbox_id_for
from corral.errors import EpisodeError
from corral.sdk import Corral, Episode
from policies.alert import make_alert
from sandbox import Containerd
from tests.integration.conftest import wait_for
from workers.netns import Rig
from workers.stack import Stack
from workflows.nodes import forget_node, list_nodes

pytestmark = pytest.mark.integration

SENSITIVE_READ = "Read sensitive file in sandbox"


def _netns_inode(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


def _intake_base(fleet: Stack) -> str:
    return f"https://{fleet.config.intake.host}:{fleet.config.intake.port}"


def _intake_ssl(fleet: Stack) -> ssl.SSLContext:
    assert fleet.config.intake.tls_ca is not None
    return ssl.create_default_context(cafile=fleet.config.intake.tls_ca)


async def _node_state(corral: Corral, node: str) -> str | None:
    nodes = await list_nodes(corral.client)
    return next((info.state for info in nodes if info.name == node), None)


def _state_is(corral: Corral, node: str, state: str | None) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await _node_state(corral, node) == state

    return check


def _has_sandbox(episode: Episode) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        status = await episode.status()
        return bool(status.sandbox_id) and status.state not in ("placing", "provisioning")

    return check


async def _sandbox_ids(fleet: Stack, node: str) -> list[str]:
    async with await Containerd.connect(
        str(fleet.config.containerd_socket(node)),
        namespace=fleet.config.nodes.containerd_namespace,
    ) as client:
        return [info.id for info in await client.list_sandboxes()]


def _visible(corral: Corral, query: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return [wf.id async for wf in corral.client.list_workflows(query, limit=1)] != []

    return check


async def test_each_node_has_its_own_network_namespace(fleet: Stack, fleet_corral: Corral) -> None:
    host_ns = _netns_inode(os.getpid())
    seen = set()
    for node in fleet.config.node_names():
        pids = [fleet.process(f"node-worker-{node}").pid(), fleet.process(f"sensor-{node}").pid()]
        pids.append(fleet.daemon(node).pid)
        spaces = {_netns_inode(pid) for pid in pids if pid is not None}
        assert len(pids) == 3 and len(spaces) == 1, f"{node}: processes in {spaces}"
        assert host_ns not in spaces
        seen |= spaces
    assert len(seen) == len(fleet.config.node_names())
    # Every node joined the registry over the bridge.
    nodes = await list_nodes(fleet_corral.client)
    assert {n.name: n.state for n in nodes} == dict.fromkeys(fleet.config.node_names(), "ready")


async def test_node_reaches_control_plane_only_over_the_bridge(fleet: Stack) -> None:
    rig = Rig.for_state(fleet.config.state)
    worker_pid = fleet.process("node-worker-node-1").pid()
    assert worker_pid is not None
    # The node's own addresses: loopback and its end of the veth, nothing of the host's.
    fib_trie = Path(f"/proc/{worker_pid}/net/fib_trie").read_text()
    assert _local_addrs(fib_trie) == {"127.0.0.1", rig.node_address("node-1")}


def _local_addrs(fib_trie: str) -> set[str]:
    """Addresses marked `/32 host LOCAL` in a namespace's fib_trie."""
    lines = fib_trie.splitlines()
    return {lines[i - 1].split()[-1] for i, line in enumerate(lines) if "/32 host LOCAL" in line}


async def test_intake_serves_tls_and_keeps_its_token_check(fleet: Stack) -> None:
    base = _intake_base(fleet)
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{base}/healthz", ssl=_intake_ssl(fleet)) as resp:
            assert resp.status == 200
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await session.get(f"{base}/healthz")  # system roots do not know the rig's CA
        plain = f"http://{fleet.config.intake.host}:{fleet.config.intake.port}/healthz"
        with pytest.raises(aiohttp.ClientError):
            await session.get(plain)
        async with session.post(f"{base}/alerts", data=b"{}", ssl=_intake_ssl(fleet)) as resp:
            assert resp.status == 401


async def test_sensor_alert_reaches_its_episode_over_tls(fleet_corral: Corral) -> None:
    result = await fleet_corral.run_episode(
        {"image": "busybox", "steps": ["cat /etc/shadow; sleep 3"]}, node="node-3"
    )
    assert result.node == "node-3"
    assert [a.rule for a in result.alerts] == [SENSITIVE_READ]


async def test_falco_alert_resolved_through_sandbox_id(fleet: Stack, fleet_corral: Corral) -> None:
    """No workflow id in the alert (as from real Falco): the SandboxId prefix finds it."""
    episode = await fleet_corral.start_episode({"image": "busybox", "interactive": True})
    try:
        await wait_for(_has_sandbox(episode), timeout_s=60)
        status = await episode.status()
        # Visibility is eventually consistent: wait until the search sees the episode.
        await wait_for(_visible(fleet_corral, f"SandboxId = '{status.sandbox_id}'"))
        alert = make_alert(
            rule=SENSITIVE_READ,
            priority="Warning",
            output="Sensitive file read in sandbox (from a Falco look-alike)",
            output_fields={
                "container.id": status.sandbox_id[:12],
                "container.full_id": None,
                "proc.cmdline": "cat /etc/shadow",
                "proc.pid": 1,
            },
        )
        token = fleet.config.intake_token()
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"{_intake_base(fleet)}/alerts",
                data=alert.model_dump_json(),
                headers={"Authorization": f"Bearer {token}"},
                ssl=_intake_ssl(fleet),
            ) as resp,
        ):
            body = await resp.json()
        assert resp.status == 200, body
        assert body["status"] == "delivered" and body["workflow_id"] == episode.id
    finally:
        result = await episode.close()
    assert SENSITIVE_READ in [a.rule for a in result.alerts]


async def test_drained_node_gets_no_new_episode(fleet: Stack, fleet_corral: Corral) -> None:
    from workflows.nodes import drain_node

    await drain_node(fleet_corral.client, "node-3")
    try:
        await wait_for(_state_is(fleet_corral, "node-3", "draining"))
        # Placement reads the workflow worker's copy of the registry (refreshed each second).
        await asyncio.sleep(2)
        results = await asyncio.gather(
            *(fleet_corral.run_episode({"image": "busybox", "steps": ["true"]}) for _ in range(6))
        )
        assert all(r.outcome == "completed" for r in results)
        assert "node-3" not in {r.node for r in results}
    finally:
        await fleet.node_up("node-3")  # `node up` undrains
    assert await _node_state(fleet_corral, "node-3") == "ready"


async def test_killed_node_is_lost_then_rejoins_and_reaps(
    fleet: Stack, fleet_corral: Corral
) -> None:
    episode = await fleet_corral.start_episode(
        {"image": "busybox", "steps": ["sleep 600"]}, node="node-2"
    )
    try:
        await wait_for(_has_sandbox(episode), timeout_s=60)
        sandbox_id = (await episode.status()).sandbox_id
        await wait_for(_holds(fleet, "node-2", sandbox_id), timeout_s=60)

        killed = await fleet.node_kill("node-2")
        assert killed and not fleet.daemon("node-2").is_running()
        with pytest.raises(EpisodeError, match="node lost: node-2"):
            await episode.result(timeout_s=120)
        assert await _node_state(fleet_corral, "node-2") == "lost"
        # `corral node forget`: a lost node leaves the list at once ...
        await forget_node(fleet_corral.client, "node-2", by="test")
        await wait_for(_state_is(fleet_corral, "node-2", None))
    finally:
        if await fleet_corral.is_running(episode.id):  # the test failed midway
            await fleet.node_up("node-2")  # the sandbox must not outlive the test
            await episode.cancel()
            with contextlib.suppress(CorralError):
                await episode.result(timeout_s=120)  # teardown has run

    await fleet.node_up("node-2")  # ... and rejoins when it beats again
    assert sandbox_id not in await _sandbox_ids(fleet, "node-2")
    assert f"reaped 1 leftover sandboxes on node-2: {sandbox_id[:12]}" in (
        fleet.process("node-worker-node-2").log_tail(200)
    )
    await wait_for(_state_is(fleet_corral, "node-2", "ready"))


async def test_a_lean_episode_with_idempotent_steps_moves_off_a_lost_node(
    fleet: Stack, fleet_corral: Corral
) -> None:
    """A lean run (one node activity) cannot tell which of its steps ran on the
    node that died; when the spec says they may run twice it is placed again."""
    spec = {"image": "busybox", "steps": ["sleep 20", "echo moved"], "idempotent_steps": True}
    episode = await fleet_corral.start_episode(spec, node="node-3")
    try:
        sandbox_id = sandbox_id_for(episode.id)
        await wait_for(_holds(fleet, "node-3", sandbox_id), timeout_s=60)
        assert await fleet.node_kill("node-3")
        result = await episode.result(timeout_s=240)
        assert result.outcome == "completed" and result.node in {"node-1", "node-2"}
        assert [s.stdout for s in result.steps] == ["", "moved\n"]
    finally:
        await fleet.node_up("node-3")  # reaps the dead run's sandbox: its episode ended
        await wait_for(_state_is(fleet_corral, "node-3", "ready"))
    assert sandbox_id not in await _sandbox_ids(fleet, "node-3")


async def test_node_down_drains_and_waits_for_its_episodes(
    fleet: Stack, fleet_corral: Corral
) -> None:
    """`corral node down` (no `--now`): no new episode goes to the node, the one
    running there finishes, then the node stops."""
    episode = await fleet_corral.start_episode(
        {"image": "busybox", "steps": ["sleep 25", "echo finished"]}, node="node-3"
    )
    down: asyncio.subprocess.Process | None = None
    # The rig's own settings only: the session stack's CORRAL_* variables are in
    # this process's environment and would point the CLI at that stack.
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env["CORRAL_STATE_DIR"] = str(fleet.config.state)
    try:
        await wait_for(_holds(fleet, "node-3", sandbox_id_for(episode.id)), timeout_s=60)
        down = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "corral", "node", "down", "node-3", env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        # The CLI reports the drain once placement has had time to see it.
        output = await _read_until(down, "is draining:", timeout_s=60)
        assert await _node_state(fleet_corral, "node-3") == "draining"
        others = [await fleet_corral.run_episode({"image": "busybox", "steps": ["true"]})]
        result = await episode.result(timeout_s=120)
        output += (await down.communicate())[0].decode()
        assert down.returncode == 0, output
    finally:
        if down is not None and down.returncode is None:  # the test failed midway
            down.kill()
            await down.wait()
        await fleet.node_up("node-3")
    assert result.outcome == "completed" and result.steps[-1].stdout == "finished\n"
    assert others[0].node != "node-3"
    assert "node-3 is draining: 1 episodes still running" in output
    assert "stopped: " in output and "node-worker-node-3" in output
    await wait_for(_state_is(fleet_corral, "node-3", "ready"))


async def _read_until(process: asyncio.subprocess.Process, text: str, timeout_s: float) -> str:
    """What the process printed up to the first line holding `text`; all of it
    in the failure if it ends or times out first."""
    assert process.stdout is not None
    seen = ""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            while line := (await process.stdout.readline()).decode():
                seen += line
                if text in line:
                    return seen
    raise AssertionError(f"no {text!r} in what the CLI printed:\n{seen}")


def _holds(fleet: Stack, node: str, sandbox_id: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        with contextlib.suppress(ContainerdUnavailable):  # a loaded machine: ask again
            return sandbox_id in await _sandbox_ids(fleet, node)
        return False

    return check
