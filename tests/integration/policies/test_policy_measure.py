"""Alert-to-frozen latency and sensor overhead, printed (no timing assertions).

.venv/bin/pytest -m slow -s tests/integration/policies/test_policy_measure.py
"""

from __future__ import annotations

import asyncio
import time

import pytest

from corral.sdk import Corral
from policies.measure import alert_to_frozen, sensor_overhead
from workers.stack import Stack

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1800)]


async def test_measure_alert_to_frozen_and_sensor_overhead(sensors: Stack, corral: Corral) -> None:
    config = sensors.config
    latency = await alert_to_frozen(corral, config, runs=20, say=print)
    print(latency.line())
    assert latency.samples_ms, "no run froze its sandbox"

    # Overhead: the stack's node sensors trace every sandbox on this machine, so
    # stop them for the "off" runs; an in-process sensor is the "on" case.
    names = [f"sensor-{n}" for n in config.node_names()]
    for name in names:
        sensors.process(name).stop()
    try:
        rules = [config.resolve(p) for p in config.sensor.rules]
        overhead = await sensor_overhead(config, rules, execs=500, repeats=5, say=print)
        print(overhead.line())
        # The sensor read the loop's records; the prefilter may drop every event
        # of a /bin/true loop before the engine (no loaded rule can match one).
        assert overhead.records_seen > 0
    finally:
        for node, name in zip(config.node_names(), names, strict=True):
            (config.state / "run" / f"{name}.ready").unlink(missing_ok=True)
            sensors.process(name).start(
                sensors._python("workers.sensor", "--node", node), env=sensors._env()
            )
        deadline = time.monotonic() + 240  # a cap, not a target
        while time.monotonic() < deadline and not all(
            (config.state / "run" / f"{n}.ready").exists() for n in names
        ):
            await asyncio.sleep(0.5)
