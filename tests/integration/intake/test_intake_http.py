"""The real aiohttp intake on 127.0.0.1, with a fake delivery callback."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from pydantic import SecretStr

from policies.alert import Alert, make_alert
from policies.responses import Decision
from workers.intake import DeliveryResult, IntakeSettings, create_app

pytestmark = pytest.mark.integration

TOKEN = "s3cret-token"
KNOWN = "0123456789ab"
UNKNOWN = "ffffffffffff"


@dataclass
class FakeDeliver:
    calls: list[tuple[Alert, Decision]] = field(default_factory=list)
    fail_next: bool = False

    async def __call__(self, alert: Alert, decision: Decision) -> DeliveryResult:
        if self.fail_next:
            self.fail_next = False
            raise ConnectionError("temporal is down")
        if alert.container_id != KNOWN:
            return DeliveryResult(status="unknown_sandbox")
        self.calls.append((alert, decision))
        status = "ignored" if decision.action == "none" else "delivered"
        return DeliveryResult(status=status, workflow_id="episode-1")


@dataclass
class Intake:
    url: str
    deliver: FakeDeliver
    http: aiohttp.ClientSession

    async def post(
        self,
        body: bytes | dict[str, Any],
        path: str = "/alerts",
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, Any]]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        hdrs = {"Authorization": f"Bearer {TOKEN}"} if headers is None else headers
        async with self.http.post(self.url + path, data=data, headers=hdrs) as resp:
            return resp.status, await resp.json()


@pytest.fixture
async def intake() -> AsyncIterator[Intake]:
    deliver = FakeDeliver()
    settings = IntakeSettings(host="127.0.0.1", port=0, tokens=[SecretStr(TOKEN)])
    runner = web.AppRunner(await create_app(settings, deliver))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    async with aiohttp.ClientSession() as http:
        yield Intake(f"http://{host}:{port}", deliver, http)
    await runner.cleanup()


def alert_body(cid: str = KNOWN, priority: str = "Critical", **over: Any) -> dict[str, Any]:
    alert = make_alert(
        rule="Crypto miner in sandbox",
        priority=priority,
        output="Crypto miner started (command=xmrig)",
        output_fields={"container.id": cid, "proc.cmdline": "xmrig -o x", "proc.pid": 9},
        tags=["corral"],
    )
    body: dict[str, Any] = json.loads(alert.to_json())
    body.update(over)
    return body


async def test_healthz_needs_no_token(intake: Intake) -> None:
    async with intake.http.get(intake.url + "/healthz") as resp:
        assert resp.status == 200
        assert await resp.json() == {"status": "ok"}


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"X-Corral-Token": "wrong"}, {"Authorization": TOKEN}],
)
async def test_401_without_or_with_wrong_token(intake: Intake, headers: dict[str, str]) -> None:
    status, body = await intake.post(alert_body(), headers=headers)
    assert status == 401
    assert "error" in body
    assert intake.deliver.calls == []


async def test_x_corral_token_header(intake: Intake) -> None:
    status, body = await intake.post(alert_body(), headers={"X-Corral-Token": TOKEN})
    assert status == 200
    assert body["status"] == "delivered"


async def test_401_even_for_garbage(intake: Intake) -> None:
    status, _ = await intake.post(b"not json", headers={})
    assert status == 401


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"not json", "alert body is not JSON"),
        (b"", "alert body is empty"),
        (b"{}", "alert is missing output, priority, rule, time, output_fields"),
        (
            json.dumps(alert_body(output_fields={"container.id": "host"})).encode(),
            "container.id must be 12 lowercase hex characters",
        ),
    ],
)
async def test_400_malformed(intake: Intake, body: bytes, message: str) -> None:
    status, resp = await intake.post(body)
    assert status == 400
    assert message in resp["error"]
    assert "\n" not in resp["error"]
    assert intake.deliver.calls == []


async def test_400_too_large(intake: Intake) -> None:
    status, resp = await intake.post(b"x" * (2 << 20))
    assert status == 400
    assert "larger than" in resp["error"]


async def test_404_unknown_sandbox(intake: Intake) -> None:
    status, body = await intake.post(alert_body(cid=UNKNOWN))
    assert status == 404
    assert body == {"error": f"unknown sandbox {UNKNOWN}"}
    # Not remembered: a retry after the sandbox registers is not a "duplicate".
    status, _ = await intake.post(alert_body(cid=UNKNOWN))
    assert status == 404


async def test_200_delivered_with_decision(intake: Intake) -> None:
    status, body = await intake.post(alert_body())
    assert status == 200
    assert body["status"] == "delivered"
    assert body["action"] == "kill"
    assert body["workflow_id"] == "episode-1"
    ((alert, decision),) = intake.deliver.calls
    assert alert.rule == "Crypto miner in sandbox"
    assert decision.action == "kill"
    assert decision.response == ["Kill on critical"]


async def test_webhook_route_takes_sidekick_body(intake: Intake) -> None:
    body = alert_body(priority="Warning")
    del body["uuid"]
    body["priority"] = "warning"
    body["tags"] = None
    status, resp = await intake.post(body, path="/webhook")
    assert status == 200
    assert resp["status"] == "delivered"
    assert resp["action"] == "notify"


async def test_ignored_when_decision_is_none(intake: Intake) -> None:
    status, body = await intake.post(alert_body(priority="Debug"))
    assert status == 200
    assert body["status"] == "ignored"
    assert body["action"] == "none"


async def test_duplicates_by_uuid(intake: Intake) -> None:
    body = alert_body()
    first = await intake.post(body)
    second = await intake.post(body)
    assert first[0] == second[0] == 200
    assert second[1] == {"status": "duplicate", "action": "kill", "rule": body["rule"]}
    assert len(intake.deliver.calls) == 1


async def test_duplicates_without_uuid(intake: Intake) -> None:
    body = alert_body()
    del body["uuid"]
    await intake.post(body, path="/webhook")
    status, resp = await intake.post(body, path="/webhook")
    assert (status, resp["status"]) == (200, "duplicate")
    other_time = dict(body, time="2020-01-01T00:00:00Z")
    status, resp = await intake.post(other_time, path="/webhook")
    assert resp["status"] == "delivered"
    assert len(intake.deliver.calls) == 2


async def test_delivery_failure_is_503_and_retry_delivers(intake: Intake) -> None:
    body = alert_body()
    intake.deliver.fail_next = True
    status, resp = await intake.post(body)
    assert status == 503
    assert "temporal is down" in resp["error"]
    status, resp = await intake.post(body)
    assert (status, resp["status"]) == (200, "delivered")
