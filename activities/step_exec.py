"""One step in a sandbox, journaled on the node so that it never runs twice.

`exec_step` journals each step in `<state_dir>/journal/<sandbox>/steps.log`:
a line when it starts, before it runs (the marker), and one with its result
after (`StepJournal`). A retried step is answered from the journal; a step
whose worker died mid-exec is reattached (a fixed exec id, output in files the
shim writes) for its real exit code; one lost with its sandbox is reported
`interrupted: <cause>`. Each step waits for the node's sensor before it starts
and for its verdict before its result returns (activities/sensorwatch.py), and
carries the model calls that ended while it ran (activities/gateway.py).
"""

from __future__ import annotations

import asyncio
import os
import shutil
from datetime import UTC, datetime
from pathlib import Path

from temporalio import activity

from activities.gateway import NodeGateway
from activities.glue import heartbeating, mapped, to_app_error
from activities.ledger import NodeLedger
from activities.sensorwatch import SensorWatch, Verdict
from contract.errors import SandboxError, SandboxNotFound, kinds_where
from contract.models import ExecStepInput, ModelCall, StepResult
from observability.metrics import Metrics
from observability.tracing import ATTR_NODE, ATTR_SANDBOX_ID, span
from sandbox.models import ExecResult
from sandbox.runtime import SandboxRuntime

INTERRUPTED_EXIT_CODE = 255
# Worth a retry: containerd may come back. Any other error loses the step.
CONTAINERD_DOWN = kinds_where(lambda kind: kind.lost_step and kind.retryable)


class StepRunner:
    def __init__(
        self,
        node: str,
        runtime: SandboxRuntime,
        state_dir: Path,
        ledger: NodeLedger,
        *,
        sensor: SensorWatch | None = None,
        gateway: NodeGateway | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.node = node
        self._runtime = runtime
        self._state_dir = state_dir
        self._ledger = ledger
        # The node's sensor: watching before a command starts, its events
        # judged before the result returns.
        self._sensor = sensor
        self._gateway = gateway
        self._metrics = metrics
        self._verdicts: dict[str, Verdict] = {}  # the last step's, by sandbox
        self._journals = StepJournals()

    async def exec_step(self, input: ExecStepInput) -> StepResult:
        journal = self._journals.of(self._journal_dir(input.sandbox_id))
        started_at, done = journal.read(input.index)
        if done is not None:
            return done
        result, settling = None, None
        if started_at is not None:
            result = await self._reattach(input, started_at)  # None: it never started
        if result is None:
            gaps = await self._sensor_required()
            journal.start(input.index, datetime.now(UTC))
            result, settling = await self._run(input, gaps)
        verdict = await (settling if settling is not None else self.settle(input.sandbox_id))
        self._verdicts[input.sandbox_id] = verdict
        result.sensor, result.settle_ms = verdict.status, verdict.waited_ms
        result.model_calls = self.model_calls(input.sandbox_id)
        journal.end(input.index, result)
        return result

    def last_verdict(self, sandbox_id: str) -> Verdict:
        """The sensor's verdict on the sandbox's last step (taken: asked once)."""
        return self._verdicts.pop(sandbox_id, None) or Verdict(status="off")

    async def settle(self, sandbox_id: str, gaps: int | None = None) -> Verdict:
        """Until the sensor has judged the sandbox's events so far (bounded)."""
        if self._sensor is None:
            return Verdict(status="off")
        return await heartbeating(self._sensor.settle(sandbox_id, gaps))

    def model_calls(self, sandbox_id: str) -> list[ModelCall]:
        """The sandbox's model calls that ended since they were last taken."""
        return self._gateway.drain(sandbox_id) if self._gateway else []

    def forget(self, sandbox_id: str) -> None:
        """The sandbox is gone: its journal and verdict go with it."""
        self._journals.forget(self._journal_dir(sandbox_id))
        shutil.rmtree(self._journal_dir(sandbox_id), ignore_errors=True)
        self._verdicts.pop(sandbox_id, None)

    async def _sensor_required(self) -> int | None:
        """The sensor's gap count, or SensorDown (retried) when it is not watching."""
        if self._sensor is None:
            return None
        proven = self._sensor.proven_gaps()  # a recent "ok" settle: nothing to ask, no task
        if proven is not None:
            return proven
        return await heartbeating(mapped(self._sensor.require()))

    async def _run(
        self, input: ExecStepInput, gaps: int | None
    ) -> tuple[StepResult, asyncio.Future[Verdict]]:
        """The step's result, and the sensor's verdict on it under way: asked as
        soon as the command ended, while the CPU weight drops and the result is
        made (the tick's round trip is most of what a call waits for after it)."""
        step = input.step
        sandbox = await mapped(self._runtime.get_sandbox(input.sandbox_id))
        started_at = datetime.now(UTC)
        attrs = {ATTR_SANDBOX_ID: input.sandbox_id, ATTR_NODE: self.node}
        with span("corral.exec", **attrs), self._ledger.working(sandbox.id, sandbox.labels):
            # Durable: a fixed exec id and output in files, so that a worker
            # restarted mid-step reattaches to it (_reattach) instead of losing it.
            raw = await heartbeating(
                mapped(
                    sandbox.exec_durable(
                        ["/bin/sh", "-c", step.cmd] if isinstance(step.cmd, str) else step.cmd,
                        exec_id=_step_exec_id(input.index),
                        output_dir=self._step_output_dir(input),
                        env={**input.base_env, **step.env} or None,
                        workdir=step.workdir,
                        stdin=step.stdin.encode() if step.stdin is not None else None,
                        timeout_s=step.timeout_s or input.default_timeout_s,
                        output_limit_bytes=input.output_limit_bytes,
                    )
                )
            )
            settling = asyncio.ensure_future(self.settle(input.sandbox_id, gaps))
        if self._metrics:
            self._metrics.record_exec(raw.duration_s, self.node, sandbox.image)
        return _step_result(input, raw.decoded(), started_at), settling

    async def _reattach(self, input: ExecStepInput, started_at: datetime) -> StepResult | None:
        """A previous attempt started this step and its worker died. The exec outlives
        the worker (the shim holds it): wait for it and report its real result. A
        step lost with its sandbox is reported interrupted, never run twice."""
        elapsed = (datetime.now(UTC) - started_at).total_seconds()
        timeout_s = max((input.step.timeout_s or input.default_timeout_s) - elapsed, 0.001)
        try:
            sandbox = await self._runtime.get_sandbox(input.sandbox_id)
            raw = await heartbeating(
                sandbox.reattach_exec(
                    _step_exec_id(input.index),
                    self._step_output_dir(input),
                    timeout_s=timeout_s,
                    output_limit_bytes=input.output_limit_bytes,
                )
            )
        except SandboxNotFound as err:
            return self._interrupted(input, started_at, f"sandbox lost ({err})")
        except SandboxError as err:
            if type(err).__name__ in CONTAINERD_DOWN:
                raise to_app_error(err) from err  # retried: containerd may come back
            return self._interrupted(input, started_at, str(err))
        if raw is None:
            return None
        activity.logger.info("step %s of %s reattached", input.index, input.sandbox_id)
        return _step_result(input, raw.decoded(), started_at)

    def _interrupted(self, input: ExecStepInput, started_at: datetime, cause: str) -> StepResult:
        activity.logger.warning(
            "step %s of %s interrupted: %s", input.index, input.sandbox_id, cause
        )
        return interrupted_step(input, cause, started_at)

    def _journal_dir(self, sandbox_id: str) -> Path:
        return self._state_dir / "journal" / sandbox_id

    def _step_output_dir(self, input: ExecStepInput) -> Path:
        return self._journal_dir(input.sandbox_id) / f"{input.index}.out"


def interrupted_step(
    input: ExecStepInput, cause: str, started_at: datetime | None = None
) -> StepResult:
    """A step lost with its sandbox, containerd or node: no real exit code."""
    return StepResult(
        index=input.index,
        cmd=input.step.display(),
        exit_code=INTERRUPTED_EXIT_CODE,
        stderr=f"corral: interrupted: {cause}",
        source=input.source,
        started_at=started_at,
        interrupted=cause,
    )


def _step_exec_id(index: int) -> str:
    """Fixed per step, so a restarted worker finds the step's exec in the sandbox."""
    return f"step-{index}"


def _step_result(input: ExecStepInput, out: ExecResult, started_at: datetime) -> StepResult:
    return StepResult(
        index=input.index,
        cmd=input.step.display(),
        exit_code=out.exit_code,
        stdout=out.stdout,
        stderr=out.stderr,
        duration_s=out.duration_s,
        timed_out=out.timed_out,
        truncated=out.truncated,
        source=input.source,
        started_at=started_at,
    )


class StepJournal:
    """One sandbox's step journal: ``<dir>/steps.log``, a line when a step starts
    (``S <index> <time>``, written before it runs: a step found started and not
    done was cut off) and one when it ends (``R <index> <result JSON>``).

    Appended to, never a new file per step: on the node's disk making a file cost
    0.3-0.8 ms, an append a few µs. Read once per process (a worker after a crash),
    then kept as an index (line offsets) in memory. A line cut off by a crash
    (no final newline) is no line: the step is then taken as cut off, as before
    its result was written. The layout before this one (``<index>.started``, a
    marker, and ``<index>.json``, its result) is still read."""

    NAME = "steps.log"

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.path = directory / self.NAME
        self._started: dict[int, str] = {}  # index -> its start time (ISO)
        self._results: dict[int, tuple[int, int]] = {}  # index -> (offset, length) of its JSON
        self._size = 0  # bytes of whole lines: where the next one goes
        self._load()

    def read(self, index: int) -> tuple[datetime | None, StepResult | None]:
        """(when it started, its result): (None, None) for a step never started."""
        if index in self._results:
            offset, length = self._results[index]
            with self.path.open("rb") as log:
                log.seek(offset)
                return _started_at(self._started.get(index, "")), StepResult.model_validate_json(
                    log.read(length)
                )
        if index in self._started:
            return _started_at(self._started[index]), None
        return self._read_older(index)

    def start(self, index: int, started_at: datetime) -> None:
        self._started[index] = started_at.isoformat()
        self._append(f"S {index} {self._started[index]}\n".encode())

    def end(self, index: int, result: StepResult) -> None:
        head = f"R {index} ".encode()
        offset = self._append(head + result.model_dump_json().encode() + b"\n")
        self._results[index] = (offset + len(head), self._size - offset - len(head) - 1)

    def _append(self, line: bytes) -> int:
        """Appends a whole line; returns where it starts."""
        if not self._size:
            self.dir.mkdir(parents=True, exist_ok=True)
        with self.path.open("ab") as log:
            log.write(line)
        offset, self._size = self._size, self._size + len(line)
        return offset

    def _load(self) -> None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        offset = 0
        while (end := data.find(b"\n", offset)) >= 0:
            kind, index, rest = [*data[offset:end].split(b" ", 2), b"", b""][:3]
            if kind == b"S" and index.isdigit():
                self._started[int(index)] = rest.decode()
            elif kind == b"R" and index.isdigit():
                start = offset + len(kind) + len(index) + 2
                self._results[int(index)] = (start, end - start)
            offset = end + 1
        self._size = offset
        if offset < len(data):  # a line a crash cut off: gone, the next goes in its place
            os.truncate(self.path, offset)

    def _read_older(self, index: int) -> tuple[datetime | None, StepResult | None]:
        """A step journaled by a worker of the layout before (or a hand-made marker)."""
        marker, done = self.dir / f"{index}.started", self.dir / f"{index}.json"
        try:
            started = marker.read_text()
        except FileNotFoundError:
            return None, None
        result = StepResult.model_validate_json(done.read_text()) if done.exists() else None
        return _started_at(started), result


class StepJournals:
    """The journals of the sandboxes in use, by directory (a bounded few: one
    dropped is read again from its file when next asked)."""

    KEEP = 512

    def __init__(self) -> None:
        self._open: dict[Path, StepJournal] = {}

    def of(self, directory: Path) -> StepJournal:
        journal = self._open.pop(directory, None) or StepJournal(directory)
        self._open[directory] = journal  # the most recent last
        while len(self._open) > self.KEEP:
            del self._open[next(iter(self._open))]
        return journal

    def forget(self, directory: Path) -> None:
        self._open.pop(directory, None)


def _started_at(line: str) -> datetime:
    """The marker's time; a marker without one (hand-made, or cut off) counts as now."""
    try:
        return datetime.fromisoformat(line.strip())
    except ValueError:
        return datetime.now(UTC)
