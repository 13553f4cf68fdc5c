"""A Critical rule (reaching for the runtime socket) -> the episode is killed, its sandbox gone."""

from __future__ import annotations

import contextlib

import pytest
from policy_helpers import end_episode, start_interactive, wait_listed

from corral.errors import EpisodeError, EpisodeKilled, EpisodeRejected
from corral.sdk import Corral
from sandbox import Containerd
from workers.stack import Stack

pytestmark = pytest.mark.integration

RULE = "Runtime socket access from sandbox"


async def test_runtime_socket_access_kills_the_episode(
    sensors: Stack, corral: Corral, node_clients: dict[str, Containerd]
) -> None:
    ep, status = await start_interactive(corral)
    client = node_clients[status.node]
    try:
        # The socket is not mounted; the open fails, and the attempt is the signal.
        # The kill may land while the exec is still in flight: either way is fine.
        with contextlib.suppress(EpisodeRejected, EpisodeError):
            await ep.exec("cat /run/containerd/containerd.sock 2>/dev/null; true")

        with pytest.raises(EpisodeKilled) as info:
            await ep.result()
        assert RULE in str(info.value)
        result = info.value.result
        assert result is not None and result.outcome == "killed"
        assert RULE in [a.rule for a in result.alerts]

        ids = [s.id for s in await client.list_sandboxes()]
        assert status.sandbox_id not in ids
        row = await wait_listed(corral, ep.id, lambda r: r.status == "FAILED")
        assert RULE in row.anomaly_rules
    finally:
        await end_episode(ep)
