"""The sensor runs the full upstream rule set (stable + incubating + sandbox).

The engine is built the way the node sensor builds it (strict, first match),
bpftrace is started for every event type those rules need, and a read of
/etc/shadow in a fake sandbox cgroup raises the upstream rule for it. The
upstream files are read in place (never copied into the project). The
container plugin's mount fields the sandbox rules use come from a real
sandbox's OCI spec, read from a private containerd the way the node sensor does.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from test_sensor_live import FakeSandbox, collect

from policies.falco.engine import RuleEngine
from policies.falco.event import ContainerInfo, Event, mounts_from_spec
from policies.falco.event import Event as FalcoEvent
from policies.falco.fields import default_registry
from policies.sensor.cgroups import DictResolver
from policies.sensor.sensor import Sensor
from sandbox.client import Containerd
from sandbox.daemon import ContainerdDaemon
from sandbox.models import SandboxSpec
from sandbox.oci_archive import build_busybox_image
from workers.sensor import NodeContainers

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("bpftrace"), reason="root+bpftrace"),
]

REPO = Path(__file__).resolve().parents[3]
UPSTREAM = Path(os.environ.get("CORRAL_SHARED_DIR", REPO / ".." / "shared")) / "falco" / "upstream"
FILES = ["falco_rules.yaml", "falco-incubating_rules.yaml", "falco-sandbox_rules.yaml"]
SPEC_MOUNTS = [
    {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid"]},
    {"destination": "/work", "type": "bind", "source": "/srv/work", "options": ["rbind"]},
]


@pytest.fixture(scope="module")
def engine() -> RuleEngine:
    paths = [UPSTREAM / name for name in FILES]
    if not all(p.exists() for p in paths):
        pytest.skip(f"upstream rule files not found in {UPSTREAM}")
    return RuleEngine.from_files(paths, default_registry(), strict=True, rule_matching="first")


@pytest.fixture
async def watched(engine: RuleEngine, backend: str) -> AsyncIterator[tuple[FakeSandbox, Sensor]]:
    """A fake sandbox and a started sensor tracing what the upstream rules need."""
    box = FakeSandbox()
    info = ContainerInfo(full_id=box.full_id, name="sb", image="busybox:1",
                         mounts=mounts_from_spec(SPEC_MOUNTS))  # fmt: skip
    sensor = Sensor(
        engine.event_types(), resolver=DictResolver({box.full_id: info}), backend=backend
    )
    try:
        await sensor.start()
        await sensor.wait_ready(timeout=120)
        yield box, sensor
    finally:
        await sensor.stop()
        box.remove()


def test_all_three_files_compile_with_every_rule_evaluable(engine: RuleEngine) -> None:
    entries = engine.ruleset.entries
    assert {e.info.ctx.file.rsplit("/", 1)[-1] for e in entries} == set(FILES)
    assert [e.name for e in entries if e.status.value in ("unsupported", "error")] == []
    assert engine.ruleset.unbounded_rules() == []


async def test_sensor_starts_and_upstream_rule_fires(
    engine: RuleEngine, watched: tuple[FakeSandbox, Sensor]
) -> None:
    box, sensor = watched
    await asyncio.to_thread(box.run, "cat /etc/shadow > /dev/null")

    def shadow_read(events: list[Event]) -> bool:
        return any(e.type in ("open", "openat") and e.args.get("name") == "/etc/shadow"
                   for e in events)  # fmt: skip

    events = await collect(sensor, shadow_read)
    ours = [e for e in events if e.container and e.container.full_id == box.full_id]
    rules = {m.rule for e in ours for m in engine.evaluate(e)}
    assert "Read sensitive file untrusted" in rules


@pytest.mark.skipif(shutil.which("containerd") is None, reason="needs containerd")
async def test_node_sensor_serves_mount_fields_from_the_spec(tmp_path: Path) -> None:
    daemon = ContainerdDaemon(tmp_path / "ctd")
    await daemon.start()
    client = await Containerd.connect(daemon.socket, namespace="corral-falco-fidelity")
    containers = NodeContainers(daemon.socket, "corral-falco-fidelity")
    sandbox_id = "f" * 64
    try:
        image = await build_busybox_image(client)
        await client.create_sandbox(sandbox_id, SandboxSpec(image=image.name))
        await containers.refresh()
        info = containers(sandbox_id)
        assert info is not None
        assert [m.dest for m in info.mounts][:2] == ["/proc", "/dev"]
        # The upstream sandbox rule's macro reads a mount by source glob; none
        # of a sandbox's mounts comes from the host's /proc, so no value.
        proc = FalcoEvent(type="execve", container=info)
        mount_dest = default_registry().get("container.mount.dest")
        assert mount_dest is not None
        assert mount_dest.extractor(proc, "/proc*") is None
        assert mount_dest.extractor(proc, 0) == "/proc"
    finally:
        await client.destroy_sandbox(sandbox_id)
        await containers.close()
        await client.close()
        await daemon.stop(kill_shims=True)
