"""The compiled sensor in a real busybox sandbox (a private containerd): calls the
seccomp profile denies are seen, the watermark (``Sensor.tick``) answers only
after the events before it were delivered, and a killed loader is a counted gap.

No sleeps decide anything: a step's events are awaited with ``tick``; the caps
(``CAP_S``) only turn a broken sensor into a failure instead of a hang.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from sensor_helpers import FakeSandbox

from policies.falco.engine import Match, RuleEngine
from policies.falco.event import ContainerInfo, Event
from policies.falco.fields import default_registry
from policies.runner import new_sandbox_id
from policies.sensor import libbpf as lb
from policies.sensor.cgroups import DictResolver
from policies.sensor.sensor import Sensor
from sandbox.client import Containerd
from sandbox.daemon import ContainerdDaemon
from sandbox.models import SandboxSpec
from sandbox.oci_archive import build_busybox_image
from sandbox.sandbox import Sandbox

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="root (BPF, containerd)"),
    pytest.mark.skipif(shutil.which("containerd") is None, reason="needs containerd"),
    pytest.mark.skipif(not lb.raw_exit_supported(), reason="the raw sys_exit program is x86_64"),
]
REPO = Path(__file__).resolve().parents[3]
RULES = REPO / "policies/rules/corral_rules.yaml"
CAP_S = 60.0
EPERM = 1
ESRCH = 3


@dataclass
class Box:
    sandbox: Sandbox
    sensor: Sensor
    full_id: str
    engine: RuleEngine
    events: list[Event] = field(default_factory=list)
    matches: list[tuple[Event, Match]] = field(default_factory=list)

    def on_event(self, evt: Event) -> None:
        if evt.container is not None and evt.container.full_id == self.full_id:
            self.events.append(evt)
            self.matches.extend((evt, m) for m in self.engine.evaluate(evt))

    async def step(self, cmd: str) -> int:
        """Run one command; once it returned, wait for its events (the watermark)."""
        result = await self.sandbox.exec(cmd, timeout_s=CAP_S)
        assert await self.sensor.tick(CAP_S) == "ok"
        return result.exit_code


@pytest.fixture
async def box(tmp_path: Path) -> AsyncIterator[Box]:
    if lb.loader_path() is None:
        pytest.skip(f"the compiled sensor is not built in {lb.build_dir()} (scripts/setup.sh)")
    engine = RuleEngine.from_files([RULES], default_registry(), strict=True,
                                   rule_matching="first")  # fmt: skip
    daemon = ContainerdDaemon(tmp_path / "ctd")
    await daemon.start()
    client = await Containerd.connect(daemon.socket, namespace="corral-sensor-watermark")
    sandbox_id = new_sandbox_id()
    info = ContainerInfo(full_id=sandbox_id, name="watermark", image="busybox")
    sensor = Sensor(engine.event_types(), resolver=DictResolver({sandbox_id: info}),
                    backend="libbpf", backoff=(0.2, 1.0))  # fmt: skip
    made = False
    try:
        image = await build_busybox_image(client)
        sandbox = await client.create_sandbox(sandbox_id, SandboxSpec(image=image.name))
        made = True
        b = Box(sandbox, sensor, sandbox_id, engine)
        sensor.add_callback(b.on_event)
        await sensor.start()
        await sensor.wait_ready(timeout=CAP_S)
        yield b
    finally:
        await sensor.stop()
        if made:
            await client.destroy_sandbox(sandbox_id)
        await client.close()
        await daemon.stop(kill_shims=True)


async def test_mount_denied_by_seccomp_is_seen_and_alerts(box: Box) -> None:
    assert await box.step("mount -t tmpfs none /mnt") != 0  # seccomp says EPERM
    mounts = [e for e in box.events if e.type == "mount"]
    assert len(mounts) == 1, mounts  # one record per call: raw exit only
    evt = mounts[0]
    assert evt.res == -EPERM and evt.args["dev"] == "none" and evt.args["dir"] == "/mnt"
    assert evt.proc.name == "mount"
    assert [m.rule for e, m in box.matches if e is evt] == ["Mount in sandbox"]


async def test_tick_answers_after_each_steps_write_was_delivered(box: Box) -> None:
    for i in range(20):
        assert await box.step(f"echo {i} > /tmp/w{i}") == 0
        names = {e.fd.name for e in box.events if e.type == "openat" and e.fd is not None}
        assert f"/tmp/w{i}" in names, f"round {i}: the write was not delivered before tick"
    assert box.sensor.stats.ticks >= 20 and box.sensor.stats.ticks_behind == 0


async def test_a_killed_loader_is_a_counted_gap(box: Box) -> None:
    assert await box.step("true") == 0
    gaps, restarts = box.sensor.stats.gaps, box.sensor.stats.restarts
    proc = box.sensor._proc
    assert proc is not None
    os.kill(proc.pid, signal.SIGKILL)
    await asyncio.wait_for(proc.wait(), CAP_S)
    assert await box.sensor.tick(CAP_S) == "down"  # nothing answers for that time

    async def back() -> None:
        while (r := await box.sensor.tick(CAP_S)) != "ok":
            assert r == "down"
            await asyncio.sleep(0.1)  # the supervisor restarts the loader

    await asyncio.wait_for(back(), CAP_S)
    assert box.sensor.stats.gaps == gaps + 1 and box.sensor.stats.restarts == restarts + 1
    assert await box.step("echo z > /tmp/after") == 0
    assert any(e.fd is not None and e.fd.name == "/tmp/after" for e in box.events)


PTRACE_ATTACH = (
    "import ctypes; libc = ctypes.CDLL(None); libc.ptrace.restype = ctypes.c_long; "
    "libc.ptrace(16, 0x3fffffff, 0, 0)"  # PTRACE_ATTACH to no such pid: ESRCH, nothing stops
)


async def test_ptrace_attempt_goes_through_the_raw_exit_and_alerts() -> None:
    """ptrace's enter/exit pair is not attached (the raw exit writes it): a refused
    attach from a (fake) sandbox cgroup is one record with its arguments."""
    if lb.loader_path() is None:
        pytest.skip(f"the compiled sensor is not built in {lb.build_dir()} (scripts/setup.sh)")
    engine = RuleEngine.from_files([RULES], default_registry(), strict=True,
                                   rule_matching="first")  # fmt: skip
    fake = FakeSandbox()
    info = ContainerInfo(full_id=fake.full_id, name="fake", image="python")
    sensor = Sensor(engine.event_types(), resolver=DictResolver({fake.full_id: info}),
                    backend="libbpf")  # fmt: skip
    seen: list[tuple[Event, list[str]]] = []

    def on_event(evt: Event) -> None:
        if evt.type == "ptrace" and evt.container and evt.container.full_id == fake.full_id:
            seen.append((evt, [m.rule for m in engine.evaluate(evt)]))

    sensor.add_callback(on_event)
    try:
        await sensor.start()
        await sensor.wait_ready(timeout=CAP_S)
        out = await asyncio.to_thread(fake.run, f"{sys.executable} -c '{PTRACE_ATTACH}'")
        assert out.returncode == 0, out.stderr
        assert await sensor.tick(CAP_S) == "ok"
        assert len(seen) == 1, seen
        evt, rules = seen[0]
        assert evt.res == -ESRCH and evt.args["pid"] == 0x3FFFFFFF
        assert rules == ["PTRACE denied in sandbox"]
    finally:
        await sensor.stop()
        fake.remove()
