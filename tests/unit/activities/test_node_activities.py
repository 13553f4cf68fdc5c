"""The real `NodeActivities` over the shared in-memory `FakeRuntime` (sandbox/fake.py).

Provision (idempotent by sandbox id, a missing image refused with nothing
left behind), steps and their journal, files, quarantine, teardown, the lean
path and the reaper, each asserted by what the node did to its sandboxes.
The node is built as a node worker builds it with the sensor off and no warm
pool (`_node`). Last, the fake and the real client are held to one protocol.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import inspect
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import ActivityEnvironment

from activities.foreground import Foreground
from activities.gateway import NodeGateway
from activities.node import NodeActivities
from activities.pool import WarmPool
from activities.sensorwatch import SensorWatch
from activities.step_exec import INTERRUPTED_EXIT_CODE
from activities.toolcalls import ToolCallActivities, ToolExecInput, ToolExecRequest
from contract.labels import OWNER_LABEL, POOL_LABEL, SERVICE_OF_LABEL
from contract.models import (
    EpisodeSpec,
    ExecStepInput,
    NodeCapacity,
    ProvisionInput,
    ReadFileInput,
    ReadFileRequest,
    ReapInput,
    RunScriptedInput,
    SandboxRef,
    Service,
    Step,
    TeardownInput,
    WriteFileInput,
    WriteFileRequest,
)
from sandbox.client import Containerd
from sandbox.fake import FakeCall, FakeImages, FakePulls, FakeRuntime, FakeSandbox
from sandbox.images import ImageStore
from sandbox.models import ExecResult, SandboxSpec
from sandbox.runtime import RuntimeImages, RuntimePulls, RuntimeSandbox, SandboxRuntime
from sandbox.sandbox import Sandbox
from sandbox.transfer import Puller

# mypy holds the real client to the protocol the node activities program against.
_REAL_RUNTIME: type[SandboxRuntime] = Containerd
_REAL_SANDBOX: type[RuntimeSandbox] = Sandbox

WORKFLOW = "episode-1"
SANDBOX = "a" * 64
CAPACITY = NodeCapacity(cores=8, memory_mb=1 << 30, pids=1 << 30, max_sandboxes=10)


def _node(
    runtime: FakeRuntime,
    state_dir: Path,
    *,
    capacity: NodeCapacity = CAPACITY,
    temporal: Client | None = None,
) -> NodeActivities:
    """The node a node worker builds (workers/node_worker.py) with `sensor.enabled`
    false: its SensorWatch answers "off" without a socket; `workers.warm_pool`
    empty: a WarmPool that serves nothing (the shared test stack runs so); a
    model gateway that no spec here asks for."""
    sensor = SensorWatch(
        state_dir / "sensor.sock", enabled=False, required=False, settle_timeout_s=1.0
    )
    foreground = Foreground()
    return NodeActivities(
        "node-1",
        runtime,
        state_dir / "node",
        temporal=temporal,
        pool=WarmPool(runtime, "node-1", {}, foreground=foreground),
        capacity=capacity,
        foreground=foreground,
        sensor=sensor,
        gateway=NodeGateway(state_dir / "node"),
    )


def _provision_input(
    sandbox_id: str = SANDBOX, image: str = "busybox", owner: str = WORKFLOW, **spec: Any
) -> ProvisionInput:
    return ProvisionInput(
        sandbox_id=sandbox_id, spec=EpisodeSpec(image=image, **spec), labels={OWNER_LABEL: owner}
    )


def _step(cmd: str, index: int = 0, sandbox_id: str = SANDBOX) -> ExecStepInput:
    return ExecStepInput(
        sandbox_id=sandbox_id,
        step=Step(cmd=cmd),
        index=index,
        default_timeout_s=60,
        output_limit_bytes=4096,
    )


def _attempt(attempt: int) -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, attempt=attempt, workflow_run_id="run-1")
    return env


class Hanging:
    """Every command runs until `release` is set (or its sandbox is destroyed)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = 0

    async def __call__(self, call: FakeCall) -> ExecResult:
        self.started += 1
        await self.release.wait()
        return ExecResult(exit_code=0, stdout="done\n", stderr="", duration_s=0.0)


async def _until(predicate: Any) -> None:
    while not predicate():
        await asyncio.sleep(0.01)


# ------------------------------------------------------------------ provision
async def test_provision_makes_the_sandbox_once_by_its_id(tmp_path: Path) -> None:
    runtime = FakeRuntime()
    node = _node(runtime, tmp_path)

    first = await _attempt(1).run(node.provision, _provision_input())
    retried = await _attempt(2).run(node.provision, _provision_input())

    assert (first.sandbox_id, first.created, first.source) == (SANDBOX, True, "cold")
    assert (retried.sandbox_id, retried.created, retried.source) == (SANDBOX, False, "existing")
    assert list(runtime.sandboxes) == [SANDBOX]
    assert runtime.sandboxes[SANDBOX].labels[OWNER_LABEL] == WORKFLOW
    assert (await node.use()).sandboxes == 1


async def test_a_missing_image_is_refused_for_good_and_leaves_nothing(tmp_path: Path) -> None:
    runtime = FakeRuntime()
    node = _node(runtime, tmp_path)

    with pytest.raises(ApplicationError) as caught:
        await _attempt(1).run(node.provision, _provision_input(image="nope"))

    assert caught.value.type == "ImageNotFound" and caught.value.non_retryable
    assert "corral.local/nope:latest" in str(caught.value)
    assert runtime.sandboxes == {}
    assert (await node.use()).sandboxes == 0  # its reservation went too


async def test_a_registry_image_is_pulled_once_on_first_use(tmp_path: Path) -> None:
    runtime = FakeRuntime(images=(), registry=["registry.test:5000/tools:1"])
    node = _node(runtime, tmp_path)

    await node.provision(_provision_input(image="registry.test:5000/tools:1"))
    await node.provision(
        _provision_input("b" * 64, image="registry.test:5000/tools:1", owner="episode-2")
    )

    assert runtime.pulls.pulled == ["registry.test:5000/tools:1"]
    assert len(runtime.sandboxes) == 2


async def test_a_full_node_refuses_the_next_sandbox(tmp_path: Path) -> None:
    runtime = FakeRuntime()
    budget = CAPACITY.model_copy(update={"max_sandboxes": 1})
    node = _node(runtime, tmp_path, capacity=budget)
    await node.provision(_provision_input())

    with pytest.raises(ApplicationError) as caught:
        await node.provision(_provision_input("b" * 64, owner="episode-2"))

    assert caught.value.type == "NodeFull" and "sandbox budget of 1" in str(caught.value)
    assert list(runtime.sandboxes) == [SANDBOX]


async def test_services_start_beside_the_agent_and_go_with_its_teardown(tmp_path: Path) -> None:
    runtime = FakeRuntime(rootfs_dir=tmp_path / "roots")
    node = _node(runtime, tmp_path)
    db = Service(name="db", image="busybox", command="serve")

    await node.provision(_provision_input(services=[db]))

    services = await runtime.list_sandboxes({SERVICE_OF_LABEL: SANDBOX})
    assert [info.labels[OWNER_LABEL] for info in services] == [WORKFLOW]
    for box in runtime.sandboxes.values():
        assert "127.0.0.1 db\n" in (await box.root_path() / "etc" / "hosts").read_text()
    await node.teardown(TeardownInput(sandbox_id=SANDBOX))
    assert runtime.sandboxes == {}


# ---------------------------------------------------------------------- steps
async def test_a_step_runs_once_and_a_retry_is_answered_from_the_journal(tmp_path: Path) -> None:
    runtime = FakeRuntime()
    node = _node(runtime, tmp_path)
    await node.provision(_provision_input())

    ok = await node.exec_step(_step("echo hello", 0))
    failed = await node.exec_step(_step("exit 3", 1))
    again = await node.exec_step(_step("echo hello", 0))

    assert (ok.exit_code, ok.stdout, ok.sensor, ok.ok) == (0, "hello\n", "off", True)
    assert (failed.exit_code, failed.ok) == (3, False)
    assert again == ok
    assert runtime.ran == [(SANDBOX, "echo hello"), (SANDBOX, "exit 3")]


async def test_a_step_whose_worker_died_is_reattached_not_run_again(tmp_path: Path) -> None:
    hanging = Hanging()
    runtime = FakeRuntime(on_exec=hanging)
    node = _node(runtime, tmp_path)
    await node.provision(_provision_input())
    cut = asyncio.create_task(node.exec_step(_step("work")))
    await _until(lambda: hanging.started == 1)
    cut.cancel()  # the worker goes; the exec goes on in its sandbox
    with contextlib.suppress(asyncio.CancelledError):
        await cut

    retry = asyncio.create_task(node.exec_step(_step("work")))
    await asyncio.sleep(0.05)
    assert not retry.done()  # waiting for the exec the first attempt started
    hanging.release.set()
    result = await retry

    assert (result.exit_code, result.stdout, result.interrupted) == (0, "done\n", "")
    assert hanging.started == 1


async def test_a_step_lost_with_its_sandbox_is_reported_interrupted(tmp_path: Path) -> None:
    hanging = Hanging()
    runtime = FakeRuntime(on_exec=hanging)
    node = _node(runtime, tmp_path)
    await node.provision(_provision_input())
    cut = asyncio.create_task(node.exec_step(_step("work")))
    await _until(lambda: hanging.started == 1)
    cut.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await cut
    await runtime.destroy_sandbox(SANDBOX)

    result = await node.exec_step(_step("work"))

    assert result.exit_code == INTERRUPTED_EXIT_CODE
    assert result.interrupted is not None and result.interrupted.startswith("sandbox lost")
    assert hanging.started == 1


# ---------------------------------------------------------------------- files
async def test_a_written_file_reads_back_and_a_missing_one_is_file_not_found(
    tmp_path: Path,
) -> None:
    runtime = FakeRuntime()
    node = _node(runtime, tmp_path)
    await node.provision(_provision_input())
    content = base64.b64encode(b"forty-two").decode()

    await node.write_file(
        WriteFileInput(
            sandbox_id=SANDBOX,
            request=WriteFileRequest(path="/task/input.txt", content_b64=content, mode=0o600),
        )
    )
    read = await node.read_file(
        ReadFileInput(sandbox_id=SANDBOX, request=ReadFileRequest(path="/task/input.txt"))
    )

    assert (read.content_b64, read.size) == (content, 9)
    assert runtime.sandboxes[SANDBOX].files["/task/input.txt"] == (b"forty-two", 0o600)
    with pytest.raises(ApplicationError) as caught:
        await node.read_file(
            ReadFileInput(sandbox_id=SANDBOX, request=ReadFileRequest(path="/nothing"))
        )
    assert caught.value.type == "FileNotFound" and caught.value.non_retryable


# ----------------------------------------------------------------- quarantine
async def test_a_frozen_sandbox_refuses_steps_until_thawed(tmp_path: Path) -> None:
    runtime = FakeRuntime()
    node = _node(runtime, tmp_path)
    await node.provision(_provision_input())
    ref = SandboxRef(sandbox_id=SANDBOX, workflow_id=WORKFLOW)

    await node.freeze(ref)
    await node.freeze(ref)  # frozen already (the sensor froze it in place): no error
    assert await runtime.sandboxes[SANDBOX].status() == "paused"
    with pytest.raises(ApplicationError) as caught:
        await node.exec_step(_step("echo x"))
    assert caught.value.type == "SandboxPaused"

    await node.thaw(ref)
    assert (await node.exec_step(_step("echo x", 1))).stdout == "x\n"


# ------------------------------------------------------------------- teardown
async def test_teardown_leaves_nothing_and_is_idempotent(tmp_path: Path) -> None:
    runtime = FakeRuntime(images=("busybox", "snap"))
    node = _node(runtime, tmp_path)
    await node.provision(_provision_input())
    await node.exec_step(_step("echo hello"))
    journal = tmp_path / "node" / "journal" / SANDBOX
    assert journal.is_dir()
    teardown = TeardownInput(sandbox_id=SANDBOX, workflow_id=WORKFLOW, drop_images=["snap"])

    first = await node.teardown(teardown)
    second = await node.teardown(teardown)

    assert (first.removed, first.sensor, second.removed) == (True, "off", False)
    assert runtime.sandboxes == {} and not journal.exists()
    assert runtime.images.names == {"corral.local/busybox:latest"}
    assert (await node.use()).sandboxes == 0


# ------------------------------------------------------------------ lean path
def _lean(steps: list[str], reward: str | None = None) -> RunScriptedInput:
    return RunScriptedInput(
        provision=_provision_input(),
        files=[WriteFileRequest(path="/task.txt", content_b64=base64.b64encode(b"7").decode())],
        steps=[Step(cmd=cmd) for cmd in steps],
        reward=Step(cmd=reward) if reward else None,
        default_timeout_s=60,
        output_limit_bytes=4096,
    )


async def test_a_lean_run_provisions_runs_rewards_and_then_tears_down(tmp_path: Path) -> None:
    runtime = FakeRuntime()
    node = _node(runtime, tmp_path)

    result = await _attempt(1).run(
        node.run_scripted, _lean(["echo start", "cat /task.txt"], reward="echo 1.0")
    )

    assert result.provision.created and result.torn_down
    assert [(s.index, s.stdout) for s in result.steps] == [(0, "start\n"), (1, "7")]
    assert result.reward is not None and result.reward.stdout == "1.0\n"
    assert result.reward.index == 2 and result.reward.source == "reward"
    await node.drain()
    assert runtime.sandboxes == {}


async def test_a_failed_lean_step_ends_the_run_without_a_reward(tmp_path: Path) -> None:
    runtime = FakeRuntime()
    node = _node(runtime, tmp_path)

    result = await node.run_scripted(_lean(["exit 1", "echo never"], reward="echo 1.0"))

    assert [s.exit_code for s in result.steps] == [1]
    assert result.reward is None
    assert [cmd for _, cmd in runtime.ran] == ["exit 1"]
    await node.drain()
    assert runtime.sandboxes == {}


# -------------------------------------------------------------------- reaping
class FakeTemporal:
    """`describe()` of the workflows it knows: `running` ones, the rest closed."""

    def __init__(self, running: set[str], closed: set[str]) -> None:
        self.running, self.closed = running, closed

    def get_workflow_handle(self, workflow_id: str) -> Any:
        async def describe() -> Any:
            if workflow_id not in self.running | self.closed:
                raise RPCError("workflow not found", RPCStatusCode.NOT_FOUND, b"")
            state = "RUNNING" if workflow_id in self.running else "COMPLETED"
            return SimpleNamespace(status=SimpleNamespace(name=state))

        return SimpleNamespace(describe=describe)


async def test_the_reaper_removes_what_closed_or_unknown_episodes_left(tmp_path: Path) -> None:
    runtime = FakeRuntime()
    temporal = FakeTemporal(running={"alive"}, closed={"ended"})
    node = _node(runtime, tmp_path, temporal=cast(Client, temporal))
    for owner, sandbox_id in (("alive", "a" * 64), ("ended", "b" * 64), ("lost", "c" * 64)):
        await node.provision(_provision_input(sandbox_id, owner=owner))
    await runtime.create_sandbox(
        "d" * 64, SandboxSpec(image="busybox"), {POOL_LABEL: "warm"}
    )  # no owner
    runtime.orphans["e" * 64] = 0.0  # a rootfs snapshot whose create was cut off
    runtime.stale_remaps.append("remap-scratch")

    result = await node.reap_orphans(ReapInput(grace_s=0))

    assert result.checked == 4
    assert sorted(result.removed) == ["b" * 64, "c" * 64, "e" * 64, "remap-scratch"]
    assert sorted(runtime.sandboxes) == ["a" * 64, "d" * 64]
    assert runtime.orphans == {}


# ----------------------------------------------------------------- tool calls
async def test_tool_calls_need_an_exec_agent_the_fake_does_not_have(tmp_path: Path) -> None:
    runtime = FakeRuntime()
    await runtime.create_sandbox(SANDBOX, SandboxSpec(image="busybox"))
    calls = ToolCallActivities("node-1", runtime, tmp_path)
    request = ToolExecRequest(cmd="echo hi", session="main")
    call = ToolExecInput(
        sandbox_id=SANDBOX, index=0, request=request, default_timeout_s=5, output_limit_bytes=64
    )

    with pytest.raises(ApplicationError) as caught:
        await calls.tool_exec(call)

    assert caught.value.type == "AgentUnavailable" and caught.value.non_retryable
    assert runtime.ran == []


# ----------------------------------------------------------- no drift allowed
PROTOCOLS = [
    (SandboxRuntime, FakeRuntime, Containerd),
    (RuntimeSandbox, FakeSandbox, Sandbox),
    (RuntimeImages, FakeImages, ImageStore),
    (RuntimePulls, FakePulls, Puller),
]


def _protocol_methods(protocol: type) -> list[str]:
    return sorted(
        name
        for name, value in vars(protocol).items()
        if not name.startswith("_") and inspect.isfunction(value)
    )


def _accepts(wanted: inspect.Signature, offered: inspect.Signature, where: str) -> None:
    """`offered` takes every parameter of `wanted`, alike; any more are optional."""
    for name, param in wanted.parameters.items():
        got = offered.parameters.get(name)
        assert got is not None, f"{where} lacks parameter {name!r}"
        assert got.kind == param.kind, f"{where}: {name!r} is {got.kind}, not {param.kind}"
        if param.default is not inspect.Parameter.empty:
            assert got.default is not inspect.Parameter.empty, f"{where}: {name!r} needs a default"
    for name, got in offered.parameters.items():
        optional = got.default is not inspect.Parameter.empty or got.kind in (
            inspect.Parameter.VAR_POSITIONAL,
            inspect.Parameter.VAR_KEYWORD,
        )
        assert name in wanted.parameters or optional, f"{where}: extra parameter {name!r}"


@pytest.mark.parametrize(("protocol", "fake", "real"), PROTOCOLS, ids=lambda p: p.__name__)
def test_the_fake_and_the_real_client_offer_the_same_protocol_methods(
    protocol: type, fake: type, real: type
) -> None:
    methods = _protocol_methods(protocol)
    assert methods, protocol
    for name in methods:
        wanted = getattr(protocol, name)
        for implementation in (fake, real):
            where = f"{implementation.__name__}.{name}"
            method = getattr(implementation, name, None)
            assert method is not None, f"{where} is missing"
            assert inspect.iscoroutinefunction(method) == inspect.iscoroutinefunction(wanted)
            _accepts(inspect.signature(wanted), inspect.signature(method), where)
        # The fake offers exactly the protocol: a test cannot lean on more than is real.
        assert list(inspect.signature(getattr(fake, name)).parameters) == list(
            inspect.signature(wanted).parameters
        ), f"{fake.__name__}.{name}"
