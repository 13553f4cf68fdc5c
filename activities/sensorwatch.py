"""The node worker's side of the watermark: "has the sensor judged this sandbox's events?"

Every agent command runs between two questions to the node's sensor, asked
on its unix socket (`StackConfig.sensor_socket(node)`, served by
`workers/sensor_service.py`):

* ``require()`` before it starts: is the sensor watching? A node whose sensor
  is down starts no agent command: the command waits for a restarting sensor
  (up to a minute), then fails with ``SensorDown``, unless ``sensor.required``
  is false (``corral up --allow-unwatched``). A ``settle`` answered ``ok`` less
  than ``PROOF_S`` ago, on a connection still open, already says so (its tick
  came back through the attached tracer): ``require`` then asks nothing and
  takes that answer's gap count, which the step's own ``settle`` compares, so
  a sensor that restarted meanwhile makes that step's verdict ``gap`` (or
  ``down``). A sensor process that dies closes the connection: no proof then.
* ``settle(sandbox_id)`` after it ends: the sensor stamps a tick behind every
  record the kernel had written, judges the events up to it, and answers
  once each alert of the sandbox is delivered to the intake (so the alert's
  signal is in the episode's history before the step's result) or enforced
  on the node. Bounded by ``sensor.settle_timeout_s``; the answer is a
  ``Verdict`` the step carries: ``ok``, or why not (``behind``, ``down``,
  ``gap``: the sensor restarted or lost records meanwhile, ``unsupported``:
  the bpftrace backend has no ticks, ``off``: no sensor on this stack).

The protocol: one JSON line each way per question; a connection carries
many in turn, and the watch keeps idle ones for the next question.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from contract.errors import CorralError

VerdictStatus = Literal["ok", "behind", "down", "gap", "unsupported", "off"]
PING_TIMEOUT_S = 5.0
REQUIRE_WAIT_S = 60.0  # a command waits this long for a restarting sensor
REQUIRE_RETRY_S = 0.5
IDLE_CONNECTIONS = 32  # kept open for the next question (one per call in flight)
# A settle answered "ok" this recently stands for a ping: calls in quick succession
# (an agent's burst, the bench) save a round trip each; a call after a pause asks.
PROOF_S = 0.1
Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class SensorDown(CorralError):
    """The node's sensor is not watching: no agent command may start."""


class Verdict(BaseModel):
    """What the sensor could say about a sandbox's events up to a moment."""

    status: VerdictStatus
    waited_ms: float = 0.0
    gaps: int = 0
    actions: list[str] = []  # the decisions of the sandbox's alerts so far (kill, quarantine...)

    @property
    def stops_episode(self) -> bool:
        """An alert will kill or quarantine its episode: keep the sandbox for it."""
        return bool({"kill", "quarantine"} & set(self.actions))

    @property
    def clean(self) -> bool:
        return self.status in ("ok", "off")


class SensorWatch:
    def __init__(
        self,
        socket_path: Path,
        *,
        enabled: bool,
        required: bool,
        settle_timeout_s: float,
        wait_s: float = REQUIRE_WAIT_S,
    ) -> None:
        self.socket_path = socket_path
        self.enabled = enabled
        self.required = required
        self.settle_timeout_s = settle_timeout_s
        self.wait_s = wait_s
        self._idle: list[Connection] = []
        # The last "ok" settle: when, its gap count, the connection it came on.
        self._proof: tuple[float, int, Connection] | None = None

    async def require(self) -> int:
        """The sensor's gap count once it watches. A sensor that is restarting
        is waited for (``wait_s``); then SensorDown, unless it is not required."""
        if not self.enabled:
            return 0
        proven = self.proven_gaps()
        if proven is not None:
            return proven
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                answer, _ = await self._ask({"op": "ping"}, PING_TIMEOUT_S)
                why = "is not attached to the kernel" if answer.get("status") == "down" else ""
            except (OSError, TimeoutError, ValueError) as err:
                answer, why = {}, f"does not answer on {self.socket_path}: {err}"
            if not why or not self.required:
                return int(answer.get("gaps", 0))
            if time.monotonic() >= deadline:
                raise SensorDown(f"the node's sensor {why}")
            await asyncio.sleep(REQUIRE_RETRY_S)

    async def settle(self, sandbox_id: str, gaps: int | None = None) -> Verdict:
        """Until the sensor has judged the sandbox's events so far (bounded)."""
        if not self.enabled:
            return Verdict(status="off")
        started = time.monotonic()
        request = {"op": "settle", "sandbox_id": sandbox_id,
                   "timeout_s": self.settle_timeout_s, "gaps": gaps}  # fmt: skip
        try:
            answer, connection = await self._ask(request, self.settle_timeout_s + PING_TIMEOUT_S)
            verdict = Verdict.model_validate(answer)
        except (OSError, TimeoutError, ValueError):
            verdict = Verdict(status="down")
        now = time.monotonic()
        verdict.waited_ms = round((now - started) * 1000, 2)
        # "ok": its tick came back through the attached tracer; anything else proves nothing.
        self._proof = (now, verdict.gaps, connection) if verdict.status == "ok" else None
        return verdict

    def proven_gaps(self) -> int | None:
        """The gap count of a recent "ok" settle whose connection the sensor has
        not closed (it would, dying), or None: ask."""
        if self._proof is None:
            return None
        at, gaps, (reader, writer) = self._proof
        if time.monotonic() - at > PROOF_S or reader.at_eof() or writer.is_closing():
            self._proof = None
            return None
        return gaps

    async def _ask(
        self, request: dict[str, Any], timeout_s: float
    ) -> tuple[dict[str, Any], Connection]:
        """The answer, and the connection it came on (kept for the next question)."""
        async with asyncio.timeout(timeout_s):
            while self._idle:  # one kept from an earlier question; stale if the sensor restarted
                connection = self._idle.pop()
                with contextlib.suppress(OSError, ValueError, RuntimeError):  # (another loop's)
                    return await self._exchange(connection, request), connection
            connection = await asyncio.open_unix_connection(str(self.socket_path))
            return await self._exchange(connection, request), connection

    async def _exchange(self, connection: Connection, request: dict[str, Any]) -> dict[str, Any]:
        """One question on ``connection``, kept for the next one if it was answered."""
        reader, writer = connection
        try:
            writer.write(json.dumps(request).encode() + b"\n")
            await writer.drain()
            line = await reader.readline()
            answer = json.loads(line)  # b"" (the sensor hung up): ValueError
            if not isinstance(answer, dict):
                raise ValueError(f"sensor answered {line[:100]!r}")
        except BaseException:
            writer.close()  # a half-read answer must not reach the next question
            raise
        if len(self._idle) < IDLE_CONNECTIONS:
            self._idle.append(connection)
        else:
            writer.close()
        return answer

    def close(self) -> None:
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()
        self._proof = None
