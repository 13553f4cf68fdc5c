"""The sensor with real bpftrace, on a fake sandbox cgroup made by the test."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from sensor_helpers import FakeSandbox

from policies.falco.event import ContainerInfo, Event
from policies.falco.fields import default_registry
from policies.sensor.cgroups import DictResolver
from policies.sensor.sensor import Sensor

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("bpftrace"), reason="root+bpftrace"),
]

REG = default_registry()
TYPES = {"openat", "open", "execve", "connect", "symlinkat", "socket", "dup2", "procexit"}


def field(evt: Event, name: str, arg: str | int | None = None) -> object:
    spec = REG.get(name)
    assert spec is not None
    return spec.extractor(evt, arg)


@pytest.fixture
async def sandbox() -> AsyncIterator[FakeSandbox]:
    sb = FakeSandbox()
    yield sb
    sb.remove()


@pytest.fixture
async def sensor(sandbox: FakeSandbox, backend: str) -> AsyncIterator[Sensor]:
    info = ContainerInfo(full_id=sandbox.full_id, name="sb", image="busybox:1",
                         labels={"corral.workflow_id": "wf-test"})  # fmt: skip
    s = Sensor(TYPES, resolver=DictResolver({sandbox.full_id: info}), backend=backend)
    await s.start()
    await s.wait_ready(timeout=120)
    yield s
    await s.stop()


async def collect(
    sensor: Sensor, until: Callable[[list[Event]], bool], timeout: float = 30
) -> list[Event]:
    got: list[Event] = []

    async def loop() -> None:
        async for evt in sensor.events():
            got.append(evt)
            if until(got):
                return

    # Not a timing threshold: a generous cap so a broken sensor fails instead of hanging.
    await asyncio.wait_for(loop(), timeout)
    return got


def find(events: list[Event], pred: Callable[[Event], bool]) -> Event | None:
    return next((e for e in events if pred(e)), None)


async def test_open_exec_connect_and_isolation(
    sensor: Sensor, sandbox: FakeSandbox, tmp_path: Path
) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    port = server.getsockname()[1]
    marker = tmp_path / "outside-marker"
    # Outside the cgroup: must produce nothing.
    subprocess.run(["cat", str(marker)], capture_output=True, check=False)
    target = tmp_path / "bin-x"
    cmd = (
        f"cat /etc/shadow > /dev/null; touch {target}; "
        "python3 -c 'import socket; "
        f's=socket.create_connection(("127.0.0.1", {port})); s.close()\'; '
        f"ln -s /etc/shadow {tmp_path}/lnk; echo done-marker > /dev/null"
    )
    await asyncio.to_thread(sandbox.run, cmd)
    conn, _ = server.accept()
    conn.close()
    server.close()

    def done(evts: list[Event]) -> bool:
        return any(
            e.type == "symlinkat" and e.args.get("linkpath") == f"{tmp_path}/lnk" for e in evts
        )

    every = await collect(sensor, done)
    # Real sandboxes of other tests may run meanwhile: all events are from /corral
    # cgroups, and the process outside them (cat of the marker) never shows up.
    assert all(e.container is not None for e in every)
    assert not any(str(marker) in str(e.args.get("name")) for e in every)
    events = [e for e in every if e.container and e.container.full_id == sandbox.full_id]

    shadow = find(events, lambda e: e.type == "openat" and e.args.get("name") == "/etc/shadow")
    assert shadow is not None
    assert field(shadow, "proc.name") == "cat"
    assert field(shadow, "fd.name") == "/etc/shadow"
    assert field(shadow, "fd.typechar") == "f"
    assert field(shadow, "evt.is_open_read") is True
    assert field(shadow, "proc.pname") == "sh"
    assert field(shadow, "container.id") == sandbox.full_id[:12]
    assert field(shadow, "container.label", "corral.workflow_id") == "wf-test"
    assert field(shadow, "user.uid") == 0
    assert field(shadow, "user.name") == "root"
    assert field(shadow, "proc.cmdline") == "cat /etc/shadow"

    print(sorted({(e.type, str(e.args.get("name"))) for e in events if e.proc.name == "touch"}))
    touch = find(events, lambda e: e.type == "openat" and e.args.get("name") == str(target))
    assert touch is not None
    assert field(touch, "evt.is_open_write") is True
    assert "O_CREAT" in str(field(touch, "evt.arg", "flags"))

    execve = find(events, lambda e: e.type == "execve" and e.proc.name == "cat")
    assert execve is not None and execve.res == 0
    assert field(execve, "proc.exepath") == "/usr/bin/cat"
    assert field(execve, "proc.args") == "/etc/shadow"

    conn_evt = find(
        events, lambda e: e.type == "connect" and e.fd is not None and e.fd.rport == port
    )
    assert conn_evt is not None
    assert field(conn_evt, "fd.sip") == "127.0.0.1"
    assert field(conn_evt, "fd.sport") == port
    assert field(conn_evt, "fd.typechar") == "4"
    assert field(conn_evt, "fd.l4proto") == "tcp"
    assert field(conn_evt, "evt.res") == "SUCCESS"

    link = find(
        events, lambda e: e.type == "symlinkat" and e.args.get("linkpath") == f"{tmp_path}/lnk"
    )
    assert link is not None
    assert field(link, "evt.arg", "target") == "/etc/shadow"


async def test_exec_overhead(sensor: Sensor, sandbox: FakeSandbox) -> None:
    """Print (not assert) the cost of 2,000 fork+exec of /bin/true in the sandbox."""
    loop = "i=0; while [ $i -lt 2000 ]; do /bin/true; i=$((i+1)); done"
    t0 = time.perf_counter()
    await asyncio.to_thread(sandbox.run, loop)
    with_sensor = time.perf_counter() - t0
    await sensor.stop()
    t0 = time.perf_counter()
    await asyncio.to_thread(sandbox.run, loop)
    without = time.perf_counter() - t0
    over = (with_sensor - without) / without * 100
    print(f"\nsensor overhead: 2000 execs {without:.2f}s without, {with_sensor:.2f}s with "
          f"({over:+.1f}%); events={sensor.stats.events} lost={sensor.stats.lost} "
          f"dropped={sensor.stats.dropped}")  # fmt: skip
