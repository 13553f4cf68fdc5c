"""The watermark's two ends without a kernel: the node worker's client
(activities/sensorwatch.py) against the sensor's socket service
(workers/sensor_service.py) over a real unix socket, with a fake tracer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from activities.sensorwatch import SensorDown, SensorWatch
from workers.sensor_service import SensorService

SANDBOX = "ab" * 32


class FakeStats:
    gaps = 0


class FakeTracer:
    """``tick`` answers what the test says; ``attached`` follows ``_ready``."""

    def __init__(self) -> None:
        self.stats = FakeStats()
        self._ready = asyncio.Event()
        self._ready.set()
        self.answer = "ok"

    async def tick(self, timeout_s: float) -> str:
        return self.answer

    def attached(self) -> bool:
        return self._ready.is_set()


class FakePipeline:
    def __init__(self) -> None:
        self.pending: dict[str, int] = {}
        self.actions: dict[str, set[str]] = {}

    async def resolved(self, full_id: str, deadline: float) -> bool:
        return True

    async def delivered(self, full_id: str, deadline: float) -> bool:
        loop = asyncio.get_running_loop()
        while self.pending.get(full_id) and loop.time() < deadline:
            await asyncio.sleep(0.01)
        return not self.pending.get(full_id)


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[SensorService, SensorWatch]]:
    service = SensorService(FakeTracer(), FakePipeline(), tmp_path / "run" / "sensor-n.sock")
    await service.start()
    watch = SensorWatch(
        service.socket_path, enabled=True, required=True, settle_timeout_s=0.5, wait_s=0.3
    )
    yield service, watch
    watch.close()
    await service.stop()


async def test_settle_answers_ok_with_the_sandboxes_decisions(
    served: tuple[SensorService, SensorWatch],
) -> None:
    service, watch = served
    service.pipeline.actions[SANDBOX] = {"quarantine"}
    verdict = await watch.settle(SANDBOX, await watch.require())
    assert verdict.status == "ok" and verdict.stops_episode and verdict.clean


async def test_settle_waits_for_pending_alerts_then_says_behind(
    served: tuple[SensorService, SensorWatch],
) -> None:
    service, watch = served
    service.pipeline.pending[SANDBOX] = 1  # an alert that never gets delivered
    verdict = await watch.settle(SANDBOX)
    assert verdict.status == "behind" and not verdict.clean


async def test_a_gap_since_the_step_started_is_reported(
    served: tuple[SensorService, SensorWatch],
) -> None:
    service, watch = served
    gaps = await watch.require()
    service.sensor.stats.gaps += 1  # the tracer restarted during the step
    assert (await watch.settle(SANDBOX, gaps)).status == "gap"


async def test_down_and_unsupported_tracers(served: tuple[SensorService, SensorWatch]) -> None:
    service, watch = served
    service.sensor.answer = "unsupported"  # bpftrace: no ticks
    assert (await watch.settle(SANDBOX)).status == "unsupported"
    service.sensor._ready.clear()
    with pytest.raises(SensorDown, match="not attached"):
        await watch.require()


async def test_no_sensor_socket_refuses_commands_unless_allowed(tmp_path: Path) -> None:
    sock = tmp_path / "missing.sock"
    with pytest.raises(SensorDown, match="does not answer"):
        await SensorWatch(
            sock, enabled=True, required=True, settle_timeout_s=1, wait_s=0.3
        ).require()
    allowed = SensorWatch(sock, enabled=True, required=False, settle_timeout_s=1)
    assert await allowed.require() == 0
    assert (await allowed.settle(SANDBOX)).status == "down"
    off = SensorWatch(sock, enabled=False, required=True, settle_timeout_s=1)
    assert (await off.settle(SANDBOX)).status == "off"


async def test_a_command_waits_for_a_restarting_sensor(
    served: tuple[SensorService, SensorWatch],
) -> None:
    service, watch = served
    watch.wait_s = 5.0
    service.sensor._ready.clear()  # restarting: not attached yet
    waiting = asyncio.ensure_future(watch.require())
    await asyncio.sleep(0.3)
    assert not waiting.done()
    service.sensor._ready.set()
    assert await asyncio.wait_for(waiting, 5) == 0


async def test_a_malformed_request_gets_an_error_not_a_crash(
    served: tuple[SensorService, SensorWatch],
) -> None:
    service, _ = served
    reader, writer = await asyncio.open_unix_connection(str(service.socket_path))
    writer.write(b'{"op": "settle"}\n')
    await writer.drain()
    answer: Any = await reader.readline()
    writer.close()
    assert b"bad request" in answer


async def test_questions_share_a_connection_and_a_dropped_one_is_replaced(
    served: tuple[SensorService, SensorWatch],
) -> None:
    """The watch keeps its connection between questions (a connect per call cost
    CPU on both sides); one the sensor dropped (a restart) is replaced unseen."""
    service, watch = served
    connections: list[asyncio.StreamWriter] = []
    serve = service._serve

    async def counted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        await serve(reader, writer)

    service._serve = counted  # type: ignore[method-assign]
    await service.stop()
    await service.start()  # listening again, through `counted`
    for _ in range(5):
        assert (await watch.settle(SANDBOX, await watch.require())).status == "ok"
    assert len(connections) == 1
    connections[0].close()  # the sensor side goes away
    await asyncio.sleep(0.05)
    assert (await watch.settle(SANDBOX)).status == "ok"
    assert len(connections) == 2


def _count_pings(service: SensorService) -> list[int]:
    pings = [0]
    ping = service.ping

    async def counted() -> dict[str, Any]:
        pings[0] += 1
        return await ping()

    service.ping = counted  # type: ignore[method-assign]
    return pings


async def test_a_recent_ok_settle_stands_for_the_next_ping(
    served: tuple[SensorService, SensorWatch],
) -> None:
    """Calls in quick succession ask the sensor once each (settle), not twice: an
    "ok" settle proves it attached; its gap count is the next step's baseline."""
    service, watch = served
    pings = _count_pings(service)
    gaps = await watch.require()
    assert pings == [1]
    service.sensor.stats.gaps = 3  # a restart, seen by this step's settle
    assert (await watch.settle(SANDBOX, gaps)).status == "gap"
    assert await watch.require() == 3 and pings == [2]  # a "gap" verdict proves nothing
    assert (await watch.settle(SANDBOX, 3)).status == "ok"
    for _ in range(3):
        assert (await watch.settle(SANDBOX, await watch.require())).status == "ok"
    assert pings == [2]


async def test_the_proof_expires_and_ends_with_the_sensors_connection(
    served: tuple[SensorService, SensorWatch], monkeypatch: pytest.MonkeyPatch
) -> None:
    service, watch = served
    connections: list[asyncio.StreamWriter] = []
    serve = service._serve

    async def kept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        await serve(reader, writer)

    service._serve = kept  # type: ignore[method-assign]
    await service.stop()
    await service.start()  # listening again, through `kept`
    pings = _count_pings(service)
    assert (await watch.settle(SANDBOX)).status == "ok"
    monkeypatch.setattr("activities.sensorwatch.PROOF_S", 0.0)
    await asyncio.sleep(0.01)
    await watch.require()
    assert pings == [1]  # too old: asked
    monkeypatch.setattr("activities.sensorwatch.PROOF_S", 60.0)
    assert (await watch.settle(SANDBOX)).status == "ok"
    await service.stop()  # the sensor dies: no listener, its connections closed
    for writer in connections:
        writer.close()
    await asyncio.sleep(0.05)
    with pytest.raises(SensorDown, match="does not answer"):
        await watch.require()
