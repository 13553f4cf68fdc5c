"""policies.runner without bpftrace: the shared fake sandbox runtime and synthetic events."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from policies.falco.engine import RuleEngine
from policies.falco.event import ContainerInfo, Event, FdInfo, Process
from policies.falco.fields import default_registry
from policies.measure import percentile
from policies.runner import SandboxResolver, Watch, new_sandbox_id, run_case
from policies.testcases import PolicyTestCase
from sandbox.fake import FakeCall, FakeRuntime
from sandbox.models import ExecResult

RULES = Path(__file__).resolve().parents[3] / "policies" / "rules" / "corral_rules.yaml"
WRITE_BIN = "Write below binary dir in sandbox"


@pytest.fixture(scope="module")
def engine() -> RuleEngine:
    return RuleEngine.from_files([RULES], default_registry(), rule_matching="first")


def open_write(container: ContainerInfo, path: str, *, vpid: int | None = 7) -> Event:
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    proc = Process(pid=4242, name="sh", args=["-c", f"echo x > {path}"], vpid=vpid)
    return Event(
        type="openat", args={"dirfd": -100, "name": path, "flags": flags, "mode": 0o644},
        res=3, proc=proc, fd=FdInfo(num=3, name=path, flags=flags), container=container,
        ts_ns=1, wall_ns=1_700_000_000_123_456_789, num=1,
    )  # fmt: skip


def fake_runtime(
    watch: Watch, resolver: SandboxResolver, *, fail_exec: bool = False
) -> FakeRuntime:
    """The shared in-memory runtime (sandbox/fake.py): each command "runs" by
    feeding the watch the events it would cause."""

    def on_exec(call: FakeCall) -> ExecResult:
        if fail_exec:
            raise RuntimeError("exec failed")
        info = resolver(call.sandbox.id)
        assert info is not None  # the runner registers the sandbox before it starts
        if ">" in call.cmd:
            path = call.cmd.split(">")[-1].strip()
            watch.on_event(open_write(info, path))
        return ExecResult(exit_code=0, stdout="", stderr="", duration_s=0.0)

    return FakeRuntime(on_exec=on_exec)


def case(commands: list[str], alerts: list[str]) -> PolicyTestCase:
    return PolicyTestCase.model_validate(
        {"name": "c", "commands": commands, "expect": {"alerts": alerts}, "settle_s": 0}
    )


async def test_case_passes_and_the_sandbox_is_destroyed(engine: RuleEngine) -> None:
    watch, resolver = Watch(engine), SandboxResolver()
    client = fake_runtime(watch, resolver)
    result = await run_case(client, case(["echo x > /bin/evil"], [WRITE_BIN]), watch, resolver,
                            say=lambda _m: None)  # fmt: skip
    assert result.passed, result
    assert len({sandbox_id for sandbox_id, _ in client.ran}) == 1 and client.sandboxes == {}
    assert not watch.matches and not resolver.containers  # nothing left watched


async def test_unexpected_and_missing_alerts_fail(engine: RuleEngine) -> None:
    watch, resolver = Watch(engine), SandboxResolver()
    client = fake_runtime(watch, resolver)
    said: list[str] = []
    silent = await run_case(client, case(["echo x > /tmp/ok"], [WRITE_BIN]), watch, resolver,
                            say=said.append)  # fmt: skip
    assert not silent.passed and silent.missing == [WRITE_BIN]
    noisy = await run_case(client, case(["echo x > /usr/bin/t"], []), watch, resolver,
                           say=said.append)  # fmt: skip
    assert not noisy.passed and noisy.unexpected == [WRITE_BIN]
    assert any(WRITE_BIN in line for line in said)  # the failing match is shown


async def test_sandbox_destroyed_when_a_command_raises(engine: RuleEngine) -> None:
    watch, resolver = Watch(engine), SandboxResolver()
    client = fake_runtime(watch, resolver, fail_exec=True)
    with pytest.raises(RuntimeError):
        await run_case(client, case(["true"], []), watch, resolver, say=lambda _m: None)
    assert len(client.ran) == 1 and client.sandboxes == {}


def test_watch_ignores_other_containers(engine: RuleEngine) -> None:
    watch = Watch(engine)
    mine, other = ContainerInfo(full_id=new_sandbox_id()), ContainerInfo(full_id=new_sandbox_id())
    watch.add(mine.full_id)
    watch.on_event(open_write(other, "/bin/x"))
    watch.on_event(open_write(mine, "/bin/x"))
    matches, n = watch.pop(mine.full_id)
    assert [m.rule for m in matches] == [WRITE_BIN] and n == 1


def test_sandbox_init_is_not_the_agent(engine: RuleEngine) -> None:
    c = ContainerInfo(full_id=new_sandbox_id())
    assert engine.evaluate(open_write(c, "/bin/x", vpid=1)) == []
    assert [m.rule for m in engine.evaluate(open_write(c, "/bin/x", vpid=None))] == [WRITE_BIN]


def test_new_sandbox_id_is_falco_shaped() -> None:
    sid = new_sandbox_id()
    assert len(sid) == 64 and int(sid, 16) >= 0


def test_percentile_nearest_rank() -> None:
    data = list(range(1, 101))
    assert percentile(data, 50) == 50 and percentile(data, 99) == 99
    assert percentile([5.0], 99) == 5.0
