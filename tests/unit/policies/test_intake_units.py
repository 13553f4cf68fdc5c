"""Intake pieces that need no server: dedup set, Temporal delivery with a fake client."""

from __future__ import annotations

from typing import Any

import pytest
from alert_bodies import CID
from temporalio.service import RPCError, RPCStatusCode

from policies.alert import ANOMALY_SIGNAL, make_alert
from policies.responses import Decision
from workers.intake import SeenAlerts, TemporalDelivery

ALERT = make_alert(
    rule="Crypto miner in sandbox",
    priority="Critical",
    output="o",
    output_fields={"container.id": CID},
)


def test_seen_ttl_and_lru() -> None:
    now = [0.0]
    seen = SeenAlerts(ttl_s=10, max_items=2, clock=lambda: now[0])
    seen.add("a", "kill")
    assert seen.get("a") == "kill"
    now[0] = 11
    assert seen.get("a") is None  # expired
    seen.add("b", "notify")
    seen.add("c", "notify")
    seen.add("d", "notify")
    assert seen.get("b") is None and seen.get("d") == "notify"  # oldest evicted
    assert len(seen) == 2


class FakeHandle:
    def __init__(self, client: FakeClient, wid: str) -> None:
        self.client, self.wid = client, wid

    async def signal(self, name: str, arg: Any) -> None:
        if self.client.error is not None:
            raise self.client.error
        self.client.signals.append((self.wid, name, arg))

    async def describe(self) -> object:
        if not self.client.existed:
            raise RPCError("workflow not found", RPCStatusCode.NOT_FOUND, b"")
        return object()


class FakeClient:
    def __init__(self, error: Exception | None = None, existed: bool = True) -> None:
        self.signals: list[tuple[str, str, Any]] = []
        self.error = error
        self.existed = existed

    def get_workflow_handle(self, wid: str) -> FakeHandle:
        return FakeHandle(self, wid)


async def resolve(cid: str) -> str | None:
    return "episode-7" if cid == CID else None


def delivery(client: FakeClient) -> TemporalDelivery:
    return TemporalDelivery(client, resolve)  # type: ignore[arg-type]


async def test_signals_anomaly_with_alert_and_decision() -> None:
    client = FakeClient()
    decision = Decision(action="kill", rule=ALERT.rule, response=["Kill on critical"])
    result = await delivery(client)(ALERT, decision)
    assert (result.status, result.workflow_id) == ("delivered", "episode-7")
    ((wid, name, arg),) = client.signals
    assert (wid, name) == ("episode-7", ANOMALY_SIGNAL)
    assert arg == {
        "alert": ALERT.model_dump(mode="json"),
        "decision": decision.model_dump(mode="json"),
    }
    assert arg["alert"]["priority"] == "Critical"


async def test_none_is_not_signalled() -> None:
    client = FakeClient()
    result = await delivery(client)(ALERT, Decision(action="none", rule=ALERT.rule))
    assert result.status == "ignored"
    assert client.signals == []


async def test_unknown_container() -> None:
    other = ALERT.model_copy(update={"output_fields": {"container.id": "ffffffffffff"}})
    result = await delivery(FakeClient())(other, Decision(action="kill", rule=ALERT.rule))
    assert result.status == "unknown_sandbox"


async def test_closed_workflow_is_closed_not_unknown() -> None:
    """410 for an episode that ran and ended: the sensor then enforces on the node."""
    err = RPCError("workflow execution already completed", RPCStatusCode.NOT_FOUND, b"")
    result = await delivery(FakeClient(err))(ALERT, Decision(action="kill", rule=ALERT.rule))
    assert (result.status, result.workflow_id) == ("closed", "episode-7")


async def test_workflow_that_never_ran_is_unknown_sandbox() -> None:
    err = RPCError("workflow not found", RPCStatusCode.NOT_FOUND, b"")
    client = FakeClient(err, existed=False)
    result = await delivery(client)(ALERT, Decision(action="kill", rule=ALERT.rule))
    assert result.status == "unknown_sandbox"


async def test_other_rpc_errors_propagate() -> None:
    err = RPCError("unavailable", RPCStatusCode.UNAVAILABLE, b"")
    with pytest.raises(RPCError):
        await delivery(FakeClient(err))(ALERT, Decision(action="kill", rule=ALERT.rule))


def test_intake_waits_for_its_port_to_be_released() -> None:
    """`corral down` then `up`: the new intake binds once the old one lets go."""
    import asyncio
    import socket

    from aiohttp import web

    from workers.intake import _listen

    async def scenario() -> bool:
        held = socket.socket()
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        runner = web.AppRunner(web.Application())
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", port)
            binding = asyncio.create_task(_listen(site, port, wait_s=10))
            await asyncio.sleep(0.3)
            waited = not binding.done()
            held.close()
            await asyncio.wait_for(binding, timeout=10)
            return waited and bool(runner.addresses)
        finally:
            held.close()
            await runner.cleanup()

    assert asyncio.run(scenario())
