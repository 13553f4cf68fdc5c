"""workers.sensor's pipeline without a tracer: node filter, owner, alert JSON, rate limit,
and delivery that never drops an alert (delivered, held and retried, or enforced)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from policies.alert import parse_alert
from policies.falco.engine import RuleEngine
from policies.falco.event import ContainerInfo, Event, FdInfo, Process
from policies.falco.fields import default_registry
from workers.sensor import NodeContainers, NodePipeline, alert_body
from workers.sensor_delivery import AlertPoster, RateLimiter

RULES = Path(__file__).resolve().parents[3] / "policies" / "rules" / "corral_rules.yaml"
MINE = "a1" * 32
OTHER = "b2" * 32


def write_bin(full_id: str, path: str = "/bin/x") -> Event:
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    return Event(
        type="openat", args={"dirfd": -100, "name": path, "flags": flags, "mode": 0o644}, res=3,
        proc=Process(pid=77, name="sh", args=["-c", "echo x > /bin/x"], vpid=9),
        fd=FdInfo(num=3, name=path, flags=flags), container=ContainerInfo(full_id=full_id),
        ts_ns=123, wall_ns=1_700_000_000_000_000_001, num=1,
    )  # fmt: skip


class FakeContainers(NodeContainers):
    """The node's containerd as a dict: ``on_node`` is what a lookup finds now."""

    def __init__(self, on_node: dict[str, ContainerInfo]) -> None:
        super().__init__("/nonexistent.sock", "corral")
        self.on_node = on_node
        self.refreshes = 0

    async def refresh(self) -> set[str]:
        self.refreshes += 1
        gone = set(self.known) - set(self.on_node)
        self.known = dict(self.on_node)
        return gone

    async def lookup(self, full_id: str) -> ContainerInfo | None:
        info = self.on_node.get(full_id)
        if info is not None:
            self.known[full_id] = info
        return info


class FakePoster:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def submit(self, body: dict[str, Any], event_ts_ns: int, on_done: Any = None) -> None:
        self.bodies.append(body)
        if on_done is not None:
            on_done("delivered")


@pytest.fixture(scope="module")
def engine() -> RuleEngine:
    return RuleEngine.from_files([RULES], default_registry())


def pipeline(engine: RuleEngine, poster: FakePoster, on_node: dict[str, ContainerInfo]) -> Any:
    return NodePipeline(engine, FakeContainers(on_node), poster, hostname="h/node-1")  # type: ignore[arg-type]


async def test_only_this_nodes_sandboxes_are_reported(engine: RuleEngine) -> None:
    info = ContainerInfo(full_id=MINE, image="corral.local/busybox:latest",
                         labels={"corral.workflow_id": "ep-1"})  # fmt: skip
    poster = FakePoster()
    p = pipeline(engine, poster, {MINE: info})
    p.on_event(write_bin(OTHER))
    p.on_event(write_bin(MINE))
    assert poster.bodies == []  # both held until containerd is asked about them
    await asyncio.sleep(0.05)
    assert [b["output_fields"]["container.id"] for b in poster.bodies] == [MINE[:12]]
    assert poster.bodies[0]["output_fields"]["container.label[corral.workflow_id]"] == "ep-1"
    p.on_event(write_bin(OTHER, "/bin/y"))  # now known as foreign: dropped at once
    assert p.stats.foreign == 2 and len(poster.bodies) == 1


async def test_owner_is_read_when_the_alert_is_sent(engine: RuleEngine) -> None:
    """A warm-pool sandbox is claimed by relabelling: the cached labels are stale."""
    poster = FakePoster()
    p = pipeline(
        engine, poster, {MINE: ContainerInfo(full_id=MINE, labels={"corral.pool": "warm"})}
    )
    await p.containers.refresh()
    p.containers.on_node[MINE] = ContainerInfo(
        full_id=MINE, labels={"corral.pool": "taken", "corral.workflow_id": "ep-claimed"}
    )
    p.on_event(write_bin(MINE))
    await asyncio.sleep(0.05)
    (body,) = poster.bodies
    assert body["output_fields"]["container.label[corral.workflow_id]"] == "ep-claimed"
    assert not p.pending  # delivered: a settle would not wait


async def test_a_sandbox_made_during_a_listing_is_not_taken_for_foreign(
    engine: RuleEngine,
) -> None:
    poster = FakePoster()
    p = pipeline(engine, poster, {})
    await p.containers.refresh()  # the listing did not have it yet
    p.containers.on_node[MINE] = ContainerInfo(full_id=MINE, labels={"corral.workflow_id": "e"})
    p.on_event(write_bin(MINE))
    assert await p.resolved(MINE, asyncio.get_running_loop().time() + 5)
    await asyncio.sleep(0.05)
    assert len(poster.bodies) == 1 and p.stats.foreign == 0


async def test_alert_body_is_falco_json_with_corral_fields(engine: RuleEngine) -> None:
    evt = write_bin(MINE)
    match = engine.evaluate(evt)[0]
    body = alert_body(match, evt, "host/node-1")
    alert = parse_alert(json.dumps(body))
    assert alert.rule == "Write below binary dir in sandbox"
    assert alert.output_fields["container.id"] == MINE[:12]
    assert alert.output_fields["container.full_id"] == MINE
    assert alert.output_fields["proc.pid"] == 77
    assert alert.output_fields["proc.cmdline"] == "sh -c echo x > /bin/x"
    assert alert.uuid and alert.hostname == "host/node-1"
    assert body["time"].endswith(".000000001Z")


async def test_duplicates_are_rate_limited(engine: RuleEngine) -> None:
    poster = FakePoster()
    p = pipeline(engine, poster, {MINE: ContainerInfo(full_id=MINE)})
    await p.containers.refresh()
    for _ in range(5):
        p.on_event(write_bin(MINE))
    await asyncio.sleep(0.05)
    assert len(poster.bodies) == 1 and p.limiter.suppressed == 4


def test_rate_limiter_window() -> None:
    now = [0.0]
    rl = RateLimiter(5.0, clock=lambda: now[0])
    assert rl.allow("r", "c") and not rl.allow("r", "c") and rl.allow("r2", "c")
    now[0] = 5.1
    assert rl.allow("r", "c")


@pytest.fixture
async def intake() -> AsyncIterator[tuple[str, list[int], list[str]]]:
    """A fake intake answering with the scripted statuses, then 200."""
    script: list[int] = []
    seen: list[str] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        status = script.pop(0) if script else 200
        return web.json_response({"status": "x"}, status=status)

    app = web.Application()
    app.router.add_post("/alerts", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    yield f"http://{host}:{port}/alerts", script, seen
    await runner.cleanup()


class Enforced:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    async def __call__(self, body: dict[str, Any], reason: str) -> None:
        self.calls.append((body["rule"], reason))


async def test_poster_retries_5xx_and_404_and_enforces_final_refusals(
    intake: tuple[str, list[int], list[str]], engine: RuleEngine
) -> None:
    url, script, seen = intake
    evt = write_bin(MINE)
    body = alert_body(engine.evaluate(evt)[0], evt, "h")
    enforced = Enforced()
    poster = AlertPoster(url, "tok", enforce=enforced, backoff_s=(0.01, 0.02))
    outcomes: list[str] = []
    await poster.start()
    try:
        script.extend([503, 404, 502])  # held and retried, then 200
        poster.submit(body, 0, outcomes.append)
        await poster.drain()
        assert poster.stats.delivered == 1 and poster.stats.retries == 3
        script.append(410)  # the episode has closed: the node enforces
        poster.submit(body, 0, outcomes.append)
        script.append(400)  # refused for good: the node enforces
        await poster.drain()
        poster.submit(body, 0, outcomes.append)
        await poster.drain()
        assert outcomes == ["delivered", "enforced", "enforced"]
        assert [reason.split(":")[0] for _, reason in enforced.calls] == [
            "episode closed",
            "refused 400",
        ]
        assert poster.stats.enforced == 2 and poster.stats.held == 0
        assert set(seen) == {"Bearer tok"}
    finally:
        await poster.stop()


async def test_poster_enforces_when_the_hold_runs_out(engine: RuleEngine) -> None:
    evt = write_bin(MINE)
    body = alert_body(engine.evaluate(evt)[0], evt, "h")
    enforced = Enforced()
    poster = AlertPoster("http://127.0.0.1:9/alerts", "t", enforce=enforced,
                         hold_s=0.2, backoff_s=(0.01, 0.05))  # fmt: skip
    await poster.start()
    try:
        poster.submit(body, 0)
        await asyncio.sleep(0.05)
        assert poster.stats.held == 1  # waiting for its owner, counted
        await poster.drain()
        assert [reason.split(":")[0] for _, reason in enforced.calls] == ["undeliverable"]
        assert (poster.stats.delivered, poster.stats.enforced, poster.stats.held) == (0, 1, 0)
    finally:
        await poster.stop()


async def test_a_full_queue_enforces_instead_of_dropping() -> None:
    enforced = Enforced()
    poster = AlertPoster("http://127.0.0.1:9/alerts", "t", enforce=enforced, queue_size=2)
    for i in range(5):
        poster.submit({"rule": str(i), "output_fields": {}}, 0)
    await poster.drain()
    assert [rule for rule, _ in enforced.calls] == ["2", "3", "4"]
    assert poster.stats.enforced == 3 and poster.stats.queued == 5
    await poster.stop()


async def test_the_node_enforces_only_on_an_episodes_sandbox(
    tmp_path: Path, engine: RuleEngine
) -> None:
    """A policy test's or a bench's sandbox has no episode: recorded, never acted on."""
    from policies.responses import load_responses
    from workers.sensor_delivery import LocalEnforcer

    acted: list[str] = []

    async def act(full_id: str) -> None:
        acted.append(full_id)

    enforcer = LocalEnforcer(
        load_responses(RULES.parents[1] / "responses.yaml"), destroy=act, pause=act,
        enforced_record=tmp_path / "enforced.jsonl", frozen_record=tmp_path / "frozen.jsonl",
    )  # fmt: skip
    evt = write_bin(MINE)
    body = alert_body(engine.evaluate(evt)[0], evt, "h")  # no owner label
    await enforcer.enforce(body, "episode closed")
    assert acted == []
    assert "no episode owns" in (tmp_path / "enforced.jsonl").read_text()
    evt.container = ContainerInfo(full_id=MINE, labels={"corral.workflow_id": "ep-9"})
    owned = alert_body(engine.evaluate(evt)[0], evt, "h")
    await enforcer.enforce(owned, "episode closed")
    assert acted == [MINE]  # quarantine: frozen on the node
