"""The watermark: a step's alerts reach its episode before the step's result does.

These run on the shared stack (no warm pool, see tests/integration/conftest.py);
the detection suite (tests/integration/detection) covers the warm-pool paths.
"""

from __future__ import annotations

import asyncio

import pytest
from policy_helpers import end_episode, start_interactive, wait_status

from corral.sdk import Corral
from workers.stack import Stack

pytestmark = pytest.mark.integration

NOTIFY_RULE = "Write below etc in sandbox"  # Notice: notify, the episode goes on
QUARANTINE_RULE = "Write below binary dir in sandbox"  # Error: quarantine


@pytest.mark.parametrize("round_", range(3))
async def test_an_interactive_step_returns_after_its_alert_reached_the_episode(
    sensors: Stack, corral: Corral, round_: int
) -> None:
    ep, _ = await start_interactive(corral)
    try:
        step = await ep.exec(f"echo x > /etc/watermark{round_}")
        assert step.exit_code == 0 and step.sensor == "ok", step
        # No waiting: the alert's signal is in the history before the step's result.
        status = await ep.status()
        assert NOTIFY_RULE in status.anomaly_rules
    finally:
        await end_episode(ep)


async def test_a_lean_episode_does_not_close_before_its_alerts(
    sensors: Stack, corral: Corral
) -> None:
    result = await corral.run_episode(
        {"image": "busybox", "steps": ["echo x > /etc/watermark", "echo done"]}
    )
    assert result.outcome == "completed"
    assert NOTIFY_RULE in [a.rule for a in result.alerts]
    assert [s.sensor for s in result.steps] == ["ok", "ok"]
    assert result.sensor == "ok"


async def test_a_lean_step_that_tampers_is_frozen_in_place_and_quarantined(
    sensors: Stack, corral: Corral
) -> None:
    ep = await corral.start_episode(
        {"image": "busybox", "steps": ["echo x > /bin/evil_lean; echo after"]}
    )
    try:
        status = await wait_status(ep, lambda s: s.state == "quarantined")
        assert QUARANTINE_RULE in status.anomaly_rules
        await ep.release(reason="test: let it finish")
        result = await asyncio.wait_for(ep.result(), 120)
        assert result.outcome == "completed"
        # Frozen mid-step by the node's sensor, then thawed: the step ran to its end.
        assert result.steps[0].stdout.strip() == "after"
        assert QUARANTINE_RULE in [a.rule for a in result.alerts]
    finally:
        await end_episode(ep)


async def test_no_command_runs_while_the_nodes_sensor_is_down(
    sensors: Stack, corral: Corral
) -> None:
    ep, status = await start_interactive(corral)
    name = f"sensor-{status.node}"
    ready = sensors.config.state / "run" / f"{name}.ready"
    try:
        sensors.process(name).stop()
        ready.unlink(missing_ok=True)
        step = asyncio.ensure_future(ep.exec("echo ran > /tmp/ran; echo ran"))
        await asyncio.sleep(3)
        assert not step.done(), "a command ran while the node's sensor was down"
        sensors.process(name).start(
            sensors._python("workers.sensor", "--node", status.node), env=sensors._env()
        )
        result = await asyncio.wait_for(step, 120)  # the sensor is back: it runs, watched
        assert result.stdout.strip() == "ran" and result.sensor == "ok", result
    finally:
        if not sensors.process(name).running():
            sensors.process(name).start(
                sensors._python("workers.sensor", "--node", status.node), env=sensors._env()
            )
        for _ in range(240):  # the next tests need it attached; a cap, not a target
            if ready.exists():
                break
            await asyncio.sleep(0.5)
        await end_episode(ep)
