"""The node sensor's configuration (prefilter, lean exec records) with real bpftrace
and Corral's rules: an exec-heavy loop is dropped before the engine, the rule
still fires on what it must."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sensor_helpers import FakeSandbox

from policies.falco.engine import Match, RuleEngine
from policies.falco.event import ContainerInfo, Event
from policies.falco.fields import default_registry
from policies.sensor.cgroups import DictResolver
from policies.sensor.prefilter import Prefilter, needs_exe_details
from policies.sensor.sensor import Sensor

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("bpftrace"), reason="root+bpftrace"),
]

RULES = Path(__file__).resolve().parents[3] / "policies/rules/corral_rules.yaml"


@pytest.fixture
async def sandbox() -> AsyncIterator[FakeSandbox]:
    sb = FakeSandbox()
    yield sb
    sb.remove()


async def test_prefiltered_sensor_drops_the_loop_and_keeps_the_alert(
    sandbox: FakeSandbox, backend: str
) -> None:
    engine = RuleEngine.from_files([RULES], default_registry(), rule_matching="first")
    prefilter = Prefilter(engine)
    info = ContainerInfo(full_id=sandbox.full_id, name="sb", image="busybox:1")
    sensor = Sensor(engine.event_types(), resolver=DictResolver({sandbox.full_id: info}),
                    prefilter=prefilter, exe_details=needs_exe_details(engine),
                    backend=backend)  # fmt: skip
    delivered: list[Event] = []
    matches: list[Match] = []
    alerted = asyncio.Event()

    def on_event(evt: Event) -> None:
        delivered.append(evt)
        matches.extend(engine.evaluate(evt))
        if any(m.rule == "Read sensitive file in sandbox" for m in matches):
            alerted.set()

    sensor.add_callback(on_event)
    await sensor.start()
    try:
        await sensor.wait_ready(timeout=300)
        cmd = "i=0; while [ $i -lt 50 ]; do /bin/true; i=$((i+1)); done; cat /etc/shadow"
        result = await asyncio.to_thread(sandbox.run, cmd)
        assert result.returncode == 0, result.stderr
        # A cap so a broken sensor fails instead of hanging, not a timing target.
        await asyncio.wait_for(alerted.wait(), 60)
    finally:
        await sensor.stop()
    ours = [e for e in delivered if e.container and e.container.full_id == sandbox.full_id]
    assert not [e for e in ours if e.type == "execve" and e.proc.name == "true"]
    assert prefilter.dropped >= 50  # the loop's execs, and the libraries they open
    shadow = next(m for m in matches if m.rule == "Read sensitive file in sandbox")
    assert shadow.output_fields["fd.name"] == "/etc/shadow"
    assert shadow.output_fields["proc.name"] == "cat"
