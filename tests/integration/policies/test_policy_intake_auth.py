"""Forged and broken alerts at the real intake change nothing."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from policy_helpers import end_episode, start_interactive, wait_listed

from corral.sdk import Corral
from policies.alert import make_alert
from workers.stack import Stack

pytestmark = pytest.mark.integration


def forged(container_full_id: str) -> dict[str, Any]:
    """A well-formed Critical alert for a real container: would kill it if believed."""
    alert = make_alert(
        rule="Crypto miner in sandbox",
        priority="Critical",
        output="Crypto miner started in sandbox (command=xmrig)",
        output_fields={
            "container.id": container_full_id[:12],
            "container.full_id": container_full_id,
            "proc.cmdline": "xmrig -o stratum+tcp://pool:3333",
            "proc.pid": 4242,
        },
        tags=["corral"],
    )
    return json.loads(alert.to_json())


async def test_forged_and_malformed_alerts_are_refused(stack: Stack, corral: Corral) -> None:
    config = stack.config
    token = config.intake_token()
    assert token
    url = f"http://{config.intake.host}:{config.intake.port}"
    ep, status = await start_interactive(corral)
    body = json.dumps(forged(status.sandbox_id)).encode()
    try:
        async with aiohttp.ClientSession() as http:

            async def post(data: bytes, headers: dict[str, str], path: str = "/alerts") -> int:
                async with http.post(url + path, data=data, headers=headers) as resp:
                    return resp.status

            assert await post(body, {}) == 401
            assert await post(body, {}, "/webhook") == 401
            assert await post(body, {"Authorization": "Bearer not-the-token"}) == 401
            assert await post(body, {"X-Corral-Token": "not-the-token"}) == 401
            good = {"Authorization": f"Bearer {token}"}
            assert await post(b"{not json", good) == 400
            assert await post(json.dumps({"rule": "x"}).encode(), good) == 400
            unknown = forged("0" * 64)  # no sandbox id starts with twelve zeros
            assert await post(json.dumps(unknown).encode(), good) == 404

        await asyncio.sleep(1.0)  # give a wrongly accepted signal time to show
        now = await ep.status()
        assert now.state == "running" and not now.anomaly_rules and not now.quarantined
        row = await wait_listed(corral, ep.id, lambda r: r.state == "running")
        assert row.status == "RUNNING" and row.anomaly_rules == []
        assert (await ep.exec("echo still-here")).stdout.strip() == "still-here"
        assert (await ep.finish()).outcome == "completed"
    finally:
        await end_episode(ep)
