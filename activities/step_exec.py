"""One step in a sandbox, journaled on the node so that it never runs twice.

`exec_step` journals each step under `<state_dir>/journal/<sandbox>/<index>`:
a `.started` marker before it runs, its result (`.json`) after. A retried step
is answered from the journal; a step whose worker died mid-exec is
reattached (a fixed exec id, output in files the shim writes) for its real
exit code; one lost with its sandbox is reported `interrupted: <cause>`. Each
step waits for the node's sensor before it starts and for its verdict before
its result returns (activities/sensorwatch.py), and carries the model calls
that ended while it ran (activities/gateway.py).
"""

from __future__ import annotations

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

    async def exec_step(self, input: ExecStepInput) -> StepResult:
        journal = self._journal_dir(input.sandbox_id)
        done, started_marker = journal / f"{input.index}.json", journal / f"{input.index}.started"
        if done.exists():
            return StepResult.model_validate_json(done.read_text())
        result, gaps = None, None
        if started_marker.exists():
            result = await self._reattach(input, started_marker)  # None: it never started
        if result is None:
            gaps = await self._sensor_required()
            journal.mkdir(parents=True, exist_ok=True)
            started_marker.write_text(datetime.now(UTC).isoformat())
            result = await self._run(input)
        verdict = await self.settle(input.sandbox_id, gaps)
        self._verdicts[input.sandbox_id] = verdict
        result.sensor, result.settle_ms = verdict.status, verdict.waited_ms
        result.model_calls = self.model_calls(input.sandbox_id)
        write_atomically(done, result.model_dump_json())
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
        shutil.rmtree(self._journal_dir(sandbox_id), ignore_errors=True)
        self._verdicts.pop(sandbox_id, None)

    async def _sensor_required(self) -> int | None:
        """The sensor's gap count, or SensorDown (retried) when it is not watching."""
        if self._sensor is None:
            return None
        return await heartbeating(mapped(self._sensor.require()))

    async def _run(self, input: ExecStepInput) -> StepResult:
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
        if self._metrics:
            self._metrics.record_exec(raw.duration_s, self.node, sandbox.image)
        return _step_result(input, raw.decoded(), started_at)

    async def _reattach(self, input: ExecStepInput, marker: Path) -> StepResult | None:
        """A previous attempt started this step and its worker died. The exec outlives
        the worker (the shim holds it): wait for it and report its real result. A
        step lost with its sandbox is reported interrupted, never run twice."""
        started_at = datetime.fromisoformat(marker.read_text())
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


def write_atomically(path: Path, text: str) -> None:
    """A journal entry whole or not at all: a crash mid-write leaves no half file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
