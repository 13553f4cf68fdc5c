"""The sensor's unix socket: ``ping`` and ``settle`` for the node worker.

One JSON request a line, answered in turn, as many on a connection as the client sends.

The client and the protocol are in `activities/sensorwatch.py`. ``settle``
is the watermark: a tick through the tracer (everything the kernel wrote
before it has been parsed and handed to the pipeline), then the sandbox's
held events judged, then its alerts delivered or enforced.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("corral.sensor.service")


class SensorService:
    def __init__(self, sensor: Any, pipeline: Any, socket_path: Path) -> None:
        self.sensor = sensor
        self.pipeline = pipeline
        self.socket_path = socket_path
        self._server: asyncio.AbstractServer | None = None
        self.settles = 0

    async def start(self) -> None:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        self.socket_path.unlink(missing_ok=True)
        self._server = await asyncio.start_unix_server(self._serve, str(self.socket_path))

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
            self._server = None
        self.socket_path.unlink(missing_ok=True)

    def gaps(self) -> int:
        return int(self.sensor.stats.gaps)

    def attached(self) -> bool:
        return bool(self.sensor.attached())

    async def ping(self) -> dict[str, Any]:
        return {"status": "ok" if self.attached() else "down", "gaps": self.gaps()}

    async def settle(self, sandbox_id: str, timeout_s: float, gaps: int | None) -> dict[str, Any]:
        self.settles += 1
        deadline = time.monotonic() + timeout_s
        status = await self.sensor.tick(timeout_s)
        if status in ("ok", "unsupported"):
            # Whatever the tracer handed over: judged, and its alerts in.
            judged = await self.pipeline.resolved(sandbox_id, deadline)
            delivered = judged and await self.pipeline.delivered(sandbox_id, deadline)
            if not delivered:
                status = "behind"
        if status == "ok" and gaps is not None and self.gaps() != gaps:
            status = "gap"
        actions = sorted(self.pipeline.actions.get(sandbox_id, ()))
        return {"status": status, "gaps": self.gaps(), "actions": actions}

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Requests in turn until the client hangs up: the node worker keeps its
        connections open (a connect per question cost both sides CPU per call)."""
        try:
            while line := await reader.readline():
                answer = await self._answer(line)
                writer.write(json.dumps(answer).encode() + b"\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _answer(self, line: bytes) -> dict[str, Any]:
        try:
            request = json.loads(line)
            op = request["op"]
            if op == "ping":
                return await self.ping()
            if op == "settle":
                sandbox_id = str(request["sandbox_id"])
                timeout_s = float(request.get("timeout_s") or 10.0)
                gaps = request.get("gaps")
                return await self.settle(sandbox_id, timeout_s, None if gaps is None else int(gaps))
            return {"error": f"unknown op {op!r}"}
        except (ValueError, KeyError, TypeError) as err:
            return {"error": f"bad request: {err}"}
