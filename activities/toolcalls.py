"""Tool calls through the exec agent (docs/agent.md): session execs and background jobs.

These activities run on the node that holds the sandbox and need its PID 1 to
be the exec agent (``workers.exec_agent`` on, the sandbox made by this worker
process); otherwise they fail with ``AgentUnavailable`` (not retried).

A session exec is durable like a step: it is journaled in
``<node_dir>/toolcalls/<sandbox>/steps.log`` (its start, then its result:
``StepJournal``), so a retry returns the recorded result, and a call whose
worker died mid-call is reported ``interrupted``, never run twice. Job
operations are idempotent reads or kills, except ``spawn``, which is journaled
by index too.
"""

from __future__ import annotations

import asyncio
import base64
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.gateway import NodeGateway
from activities.glue import heartbeating, mapped
from activities.sensorwatch import SensorWatch
from activities.step_exec import StepJournals, interrupted_step
from contract.models import ExecStepInput, FileBlob, Step, StepResult
from sandbox.agent import AgentChannel, JobOutput
from sandbox.blobs import pull_bytes, push_bytes
from sandbox.registry import RegistryOptions
from sandbox.runtime import SandboxRuntime

T = TypeVar("T")
HEARTBEAT_EVERY_S = 5.0
MAX_JOB_READ = 1_048_576
OUTPUT_POLL_S = 0.02  # a long-polled job_output asks the agent this often


# -- requests (the SDK's) and activity inputs ----------------------------------
class ToolExecRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cmd: str | list[str]
    session: str = Field(min_length=1, max_length=128)
    timeout_s: float | None = Field(default=None, gt=0)
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None
    stdin: str | None = None


class SpawnRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cmd: str | list[str]
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None
    timeout_s: float | None = Field(default=None, gt=0)
    pty: bool = False  # a pseudo-terminal (`corral episode shell`), typed into by job_stdin
    rows: int = Field(default=24, ge=1, le=1000)
    cols: int = Field(default=80, ge=1, le=1000)


class JobStdinRequest(BaseModel):
    """Bytes for a job's stdin (its terminal when spawned with ``pty``)."""

    model_config = ConfigDict(extra="forbid")
    job: int = Field(ge=1)
    data_b64: str = Field(max_length=1 << 20)
    eof: bool = False


class JobStdinInput(BaseModel):
    sandbox_id: str
    request: JobStdinRequest


class JobRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    job: int = Field(ge=1)
    stream: Literal["stdout", "stderr"] = "stdout"
    offset: int = Field(default=0, ge=0)
    max_bytes: int = Field(default=MAX_JOB_READ, ge=1, le=MAX_JOB_READ)
    timeout_s: float | None = Field(default=None, gt=0, le=300)
    signal: int = Field(default=9, ge=1, le=64)
    # job_output: wait up to this long on the node for output past `offset` (or the
    # job's end), so that a follower neither spins through Updates nor sleeps on news.
    wait_s: float = Field(default=0.0, ge=0, le=10)


class PutFileRequest(BaseModel):
    """A file whose bytes wait in the registry (sandbox/blobs.py), by digest."""

    model_config = ConfigDict(extra="forbid")
    path: str = Field(min_length=1)
    blob: FileBlob
    mode: int = Field(default=0o644, ge=0, le=0o7777)


class GetFileRequest(BaseModel):
    """Read a file into the registry; the reply names its blob."""

    model_config = ConfigDict(extra="forbid")
    path: str = Field(min_length=1)
    repository: str = Field(min_length=1)  # host[:port]/corral/files
    max_bytes: int = Field(ge=1)


class PutFileInput(BaseModel):
    sandbox_id: str
    request: PutFileRequest


class GetFileInput(BaseModel):
    sandbox_id: str
    request: GetFileRequest


class ToolExecInput(BaseModel):
    sandbox_id: str
    index: int
    request: ToolExecRequest
    default_timeout_s: float
    output_limit_bytes: int
    base_env: dict[str, str] = Field(default_factory=dict)


class SpawnInput(BaseModel):
    sandbox_id: str
    index: int
    request: SpawnRequest
    base_env: dict[str, str] = Field(default_factory=dict)


class JobInput(BaseModel):
    sandbox_id: str
    request: JobRequest


class JobInfo(BaseModel):
    job: int
    cmd: str


class JobOutputResult(BaseModel):
    data_b64: str
    offset: int
    total: int
    running: bool


class JobState(BaseModel):
    running: bool
    exit_code: int | None = None
    timed_out: bool = False
    signal: int = 0
    duration_s: float | None = None


# -- the activities --------------------------------------------------------------
class ToolCallActivities:
    """``sensor``: the node's watermark, as for steps (no command while the sensor is
    down; a session exec returns after the sensor judged its events). ``registry``:
    the hosts and credentials for files that travel as registry blobs."""

    def __init__(
        self,
        node: str,
        containerd: SandboxRuntime,
        state_dir: Path,
        sensor: SensorWatch | None = None,
        registry: RegistryOptions | None = None,
        gateway: NodeGateway | None = None,
    ) -> None:
        self.node = node
        self._gateway = gateway  # model calls ended during a call travel in its result
        self._containerd = containerd
        self._state_dir = Path(state_dir)
        self._sensor = sensor
        self._registry = registry or RegistryOptions()
        self._journals = StepJournals()  # session execs'; spawns keep a file each

    def activities(self) -> list[Any]:
        return [
            *(self.tool_exec, self.job_spawn, self.job_output, self.job_wait, self.job_kill),
            *(self.file_put, self.file_get, self.job_stdin),
        ]

    @activity.defn(name="corral.tool_exec")
    async def tool_exec(self, input: ToolExecInput) -> StepResult:
        request = input.request
        step = ExecStepInput(
            sandbox_id=input.sandbox_id,
            step=Step(
                cmd=request.cmd,
                timeout_s=request.timeout_s,
                env=request.env,
                workdir=request.workdir,
                stdin=request.stdin,
            ),
            index=input.index,
            source="interactive",
            default_timeout_s=input.default_timeout_s,
            output_limit_bytes=input.output_limit_bytes,
            base_env=input.base_env,
        )
        journal = self._journals.of(self._journal(input.sandbox_id))
        started_at, done = journal.read(input.index)
        if done is not None:
            return done
        if started_at is not None:  # a worker died mid-call: its result is lost, never rerun it
            result = interrupted_step(step, "the node worker stopped during the call")
        else:
            channel = await self._channel(input.sandbox_id)
            gaps = await self._sensor_required()
            started_at = datetime.now(UTC)
            journal.start(input.index, started_at)
            out = await heartbeating(
                mapped(
                    channel.run(
                        request.cmd,
                        env={**input.base_env, **request.env} or None,
                        cwd=request.workdir,
                        stdin=request.stdin.encode() if request.stdin is not None else None,
                        timeout_s=request.timeout_s or input.default_timeout_s,
                        output_limit_bytes=input.output_limit_bytes,
                        session=request.session,
                    )
                )
            )
            result = StepResult(
                index=input.index,
                cmd=step.step.display(),
                exit_code=out.exit_code,
                stdout=out.stdout.decode("utf-8", errors="replace"),
                stderr=out.stderr.decode("utf-8", errors="replace"),
                duration_s=out.duration_s,
                timed_out=out.timed_out,
                truncated=out.truncated,
                source="interactive",
                started_at=started_at,
            )
            if self._sensor is not None:
                verdict = await heartbeating(self._sensor.settle(input.sandbox_id, gaps))
                result.sensor, result.settle_ms = verdict.status, verdict.waited_ms
        if self._gateway is not None:
            result.model_calls = self._gateway.drain(input.sandbox_id)
        journal.end(input.index, result)
        return result

    @activity.defn(name="corral.job_spawn")
    async def job_spawn(self, input: SpawnInput) -> JobInfo:
        request = input.request
        cmd = request.cmd if isinstance(request.cmd, str) else " ".join(request.cmd)
        journal = self._journal(input.sandbox_id)
        done, started = journal / f"{input.index}.job", journal / f"{input.index}.started"
        if done.exists():
            return JobInfo.model_validate_json(done.read_text())
        if started.exists():
            raise ApplicationError(
                f"spawn of {cmd!r} was cut off by a node worker restart", type="SandboxError"
            )
        channel = await self._channel(input.sandbox_id)
        await self._sensor_required()
        journal.mkdir(parents=True, exist_ok=True)
        started.write_text(datetime.now(UTC).isoformat())
        job = await mapped(
            channel.spawn(
                request.cmd,
                env={**input.base_env, **request.env} or None,
                cwd=request.workdir,
                timeout_s=request.timeout_s,
                pty=(request.rows, request.cols) if request.pty else None,
            )
        )
        info = JobInfo(job=job, cmd=cmd)
        done.write_text(info.model_dump_json())
        return info

    @activity.defn(name="corral.job_output")
    async def job_output(self, input: JobInput) -> JobOutputResult:
        req = input.request
        channel = await self._channel(input.sandbox_id)
        out = await heartbeating(mapped(_output_when_any(channel, req)))
        return JobOutputResult(
            data_b64=base64.b64encode(out.data).decode(),
            offset=out.offset,
            total=out.total,
            running=out.running,
        )

    @activity.defn(name="corral.job_wait")
    async def job_wait(self, input: JobInput) -> JobState:
        channel = await self._channel(input.sandbox_id)
        status = await heartbeating(
            mapped(channel.wait(input.request.job, input.request.timeout_s))
        )
        return JobState(
            running=status.running,
            exit_code=status.exit_code,
            timed_out=status.timed_out,
            signal=status.signal,
            duration_s=status.duration_s,
        )

    @activity.defn(name="corral.job_stdin")
    async def job_stdin(self, input: JobStdinInput) -> None:
        req = input.request
        channel = await self._channel(input.sandbox_id)
        await mapped(channel.send_stdin(req.job, base64.b64decode(req.data_b64), req.eof))

    @activity.defn(name="corral.job_kill")
    async def job_kill(self, input: JobInput) -> None:
        channel = await self._channel(input.sandbox_id)
        await mapped(channel.kill(input.request.job, input.request.signal))

    # Files of any size: bytes through the registry, the history holds the digest.
    @activity.defn(name="corral.file_put")
    async def file_put(self, input: PutFileInput) -> None:
        request = input.request
        data = await heartbeating(mapped(pull_bytes(request.blob, self._registry)))
        sandbox = await mapped(self._containerd.get_sandbox(input.sandbox_id))
        await heartbeating(mapped(sandbox.write_file(request.path, data, request.mode)))

    @activity.defn(name="corral.file_get")
    async def file_get(self, input: GetFileInput) -> FileBlob:
        request = input.request
        sandbox = await mapped(self._containerd.get_sandbox(input.sandbox_id))
        data = await heartbeating(mapped(sandbox.read_file(request.path, request.max_bytes)))
        return await heartbeating(mapped(push_bytes(request.repository, data, self._registry)))

    async def _channel(self, sandbox_id: str) -> AgentChannel:
        sandbox = await mapped(self._containerd.get_sandbox(sandbox_id))
        channel = await sandbox.agent_channel()
        if channel is None:
            raise ApplicationError(
                f"sandbox {sandbox_id} has no exec agent channel on node {self.node}: sessions "
                "and jobs need workers.exec_agent on when it was made (or its agent did not answer "
                "when this worker attached to it: see the node worker's log)",
                type="AgentUnavailable",
                non_retryable=True,
            )
        return channel

    async def _sensor_required(self) -> int | None:
        """The sensor's gap count, or SensorDown (retried) when it is not watching."""
        if self._sensor is None:
            return None
        proven = self._sensor.proven_gaps()  # a recent "ok" settle: nothing to ask, no task
        if proven is not None:
            return proven
        return await heartbeating(mapped(self._sensor.require()))

    def _journal(self, sandbox_id: str) -> Path:
        return self._state_dir / "toolcalls" / sandbox_id


async def _output_when_any(channel: AgentChannel, req: JobRequest) -> JobOutput:
    """The job's output past ``req.offset``, waiting up to ``req.wait_s`` for some (the
    agent's `output` does not block: asked again every OUTPUT_POLL_S, on the node)."""
    deadline = asyncio.get_running_loop().time() + req.wait_s
    while True:
        out = await channel.output(req.job, req.stream, req.offset, req.max_bytes)
        if out.data or not out.running or asyncio.get_running_loop().time() >= deadline:
            return out
        await asyncio.sleep(OUTPUT_POLL_S)
