"""A write below /bin -> real sensor -> intake -> the episode is quarantined, then released."""

from __future__ import annotations

import asyncio

import pytest
from policy_helpers import (
    STATE_CAP_S,
    end_episode,
    sandbox_status,
    start_interactive,
    wait_listed,
    wait_status,
)

from corral.errors import EpisodeRejected
from corral.sdk import Corral
from sandbox import Containerd
from workers.stack import Stack

pytestmark = pytest.mark.integration

RULE = "Write below binary dir in sandbox"


@pytest.mark.parametrize("command", ["cp /bin/busybox /bin/evil", "echo x > /bin/x"])
async def test_write_below_bin_quarantines_until_released(
    sensors: Stack, corral: Corral, node_clients: dict[str, Containerd], command: str
) -> None:
    ep, status = await start_interactive(corral)
    client = node_clients[status.node]
    try:
        # The node's sensor freezes the sandbox the moment the rule matches, so
        # the step that tripped it may be held mid-command until the release.
        step = asyncio.ensure_future(ep.exec(command))
        frozen = await wait_status(ep, lambda s: s.state == "quarantined")
        assert frozen.quarantined and RULE in frozen.anomaly_rules
        assert await sandbox_status(client, status.sandbox_id) == "paused"
        row = await wait_listed(corral, ep.id, lambda r: r.state == "quarantined")
        assert RULE in row.anomaly_rules
        assert row.status == "RUNNING"

        with pytest.raises(EpisodeRejected, match="quarantined"):
            await ep.exec("echo should-not-run")
        assert await sandbox_status(client, status.sandbox_id) == "paused"

        await ep.release(reason="looked at it: fine", by="on-call")
        result = await asyncio.wait_for(step, STATE_CAP_S)
        assert result.exit_code == 0, result.stderr
        await wait_status(ep, lambda s: s.state == "running" and not s.quarantined)
        assert await sandbox_status(client, status.sandbox_id) == "running"
        after = await ep.exec("echo alive")
        assert after.exit_code == 0 and after.stdout.strip() == "alive"
        await wait_listed(corral, ep.id, lambda r: r.state == "running")

        final = await ep.finish()
        assert final.outcome == "completed"
        assert [a.rule for a in final.alerts] == [RULE]
        assert final.alerts[0].action == "quarantine"
    finally:
        await end_episode(ep)
