"""The Python SDK for trainers.

    async with await Corral.connect() as corral:
        episode = await corral.start_episode(EpisodeSpec(image="busybox", interactive=True))
        result = await episode.exec(["echo", "hi"])
        await episode.write_file("/workspace/a.txt", "data")
        final = await episode.finish()

        async for result in corral.run_batch(spec, n=1000, concurrency=50):
            ...

Everything goes through Temporal: an episode is a workflow, interactive calls
are Updates that return when the step is done, on-call actions are signals.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from pydantic import ValidationError
from temporalio.client import (
    Client,
    WorkflowExecution,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
)
from temporalio.client import (
    WorkflowExecutionStatus as Status,
)
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import (
    ApplicationError,
    CancelledError,
    TerminatedError,
    WorkflowAlreadyStartedError,
)
from temporalio.exceptions import TimeoutError as TemporalTimeoutError
from temporalio.service import RPCError, RPCStatusCode

from activities.toolcalls import (
    GetFileRequest,
    JobInfo,
    JobOutputResult,
    JobRequest,
    JobState,
    JobStdinRequest,
    PutFileRequest,
    SpawnRequest,
    ToolExecRequest,
)
from contract.config import RegistryConfig, StackConfig, describe_validation_error, load_config
from contract.errors import CorralError, kinds_where
from contract.ids import calls_workflow_id
from contract.models import (
    EpisodeResult,
    EpisodeSpec,
    ExecRequest,
    FileBlob,
    FileContent,
    ReadFileRequest,
    SnapshotRequest,
    SnapshotResult,
    StepResult,
    WriteFileRequest,
)
from contract.search_attributes import (
    ANOMALY_RULE,
    EPISODE_STATE,
    PARENT_EPISODE,
    SANDBOX_IMAGE,
    SANDBOX_NODE,
    TENANT,
)
from corral.errors import (
    CorralRPCError,
    EpisodeAlreadyExists,
    EpisodeCancelled,
    EpisodeEnded,
    EpisodeError,
    EpisodeFailed,
    EpisodeFileNotFound,
    EpisodeKilled,
    EpisodeNotAdmitted,
    EpisodeNotFound,
    EpisodeQuarantined,
    EpisodeRejected,
    EpisodeRequestFailed,
    EpisodeRequestTimedOut,
    EpisodeTerminated,
    EpisodeTimedOut,
    EpisodeWaitTimedOut,
    InvalidEpisodeSpec,
)
from observability.tracing import flush_tracing, setup_tracing
from sandbox.blobs import INLINE_MAX, files_repository, pull_bytes, push_bytes
from sandbox.registry import registry_options
from workers.temporal import connect
from workers.tenants import TenantRuleViolation, prepare_for_tenant
from workflows.calls import EpisodeCallsWorkflow
from workflows.episode import EpisodeWorkflow
from workflows.models import EpisodeInput, EpisodeStatus, OnCallRequest

_ERROR_TYPES: dict[str, type[EpisodeError]] = {
    "EpisodeKilled": EpisodeKilled,
    "EpisodeTimedOut": EpisodeTimedOut,
    "EpisodeRejected": EpisodeNotAdmitted,  # a tenant quota with `on_quota: reject`
}
# The server fails an accepted Update with this type when the workflow closes first.
_CLOSED_UNDER_UPDATE = frozenset({"AcceptedUpdateCompletedWorkflow"})
# Tool calls: sent to the episode's calls workflow while it runs (workflows/calls.py).
_CALLS = frozenset(
    {"exec", "tool_exec", "spawn", "job_output", "job_wait", "job_stdin", "job_kill"}
)
# The call met the hand-over between the episode and its calls workflow, or the
# calls workflow closed under it: the other one answers.
_HANDED_OVER = frozenset(kinds_where(lambda kind: kind.hand_over))
_CALLS_GONE = _HANDED_OVER | _CLOSED_UNDER_UPDATE
_CALL_ROUTE_ATTEMPTS = 50  # about 8 s of hand-over at most
_NOT_THERE = object()
T = TypeVar("T")
# The episode refused the request (its validators raise a plain ValueError).
_REFUSALS = frozenset(kinds_where(lambda kind: kind.refusal))


def parse_spec(spec: EpisodeSpec | dict[str, Any]) -> EpisodeSpec:
    """The spec, validated now: a model is checked again (and returned as it is),
    since its fields may have changed after it was made (pydantic checks only then)."""
    data = spec.model_dump() if isinstance(spec, EpisodeSpec) else spec
    try:
        checked = EpisodeSpec.model_validate(data)
        return spec if isinstance(spec, EpisodeSpec) else checked
    except ValidationError as err:
        raise InvalidEpisodeSpec(f"invalid episode spec: {describe_validation_error(err)}") from err


@dataclass(frozen=True)
class EpisodeSummary:
    """One row of `Corral.list_episodes`, from Temporal's visibility store."""

    episode_id: str
    status: str
    state: str
    image: str
    tenant: str
    node: str
    anomaly_rules: list[str]
    start_time: datetime | None
    close_time: datetime | None
    parent_episode: str = ""  # set on forked episodes


class Job:
    """A background job in an episode's sandbox (``Episode.spawn``)."""

    WAIT_SLICE_S = 300.0  # one Update waits at most this long
    FOLLOW_WAIT_S = 5.0  # how long one `follow` read waits on the node for new output

    def __init__(self, episode: Episode, job_id: int, cmd: str) -> None:
        self.episode = episode
        self.id = job_id
        self.cmd = cmd

    def __repr__(self) -> str:
        return f"Job(id={self.id}, cmd={self.cmd!r}, episode={self.episode.id!r})"

    async def output(self, stream: str = "stdout", *, offset: int = 0) -> bytes:
        """Its output from ``offset`` so far (the agent keeps the last 4 MiB of each stream)."""
        parts: list[bytes] = []
        while True:
            request = JobRequest(job=self.id, stream=stream, offset=offset)  # type: ignore[arg-type]
            out: JobOutputResult = await self.episode._update(
                "job_output", request, JobOutputResult
            )
            data = base64.b64decode(out.data_b64)
            parts.append(data)
            offset = out.offset + len(data)
            if not data or offset >= out.total:
                return b"".join(parts)

    async def follow(self, stream: str = "stdout") -> AsyncGenerator[bytes, None]:
        """Its output as it comes, chunk by chunk, until it ends and all is read.

        One `job_output` Update per read; each waits on the node (up to
        `FOLLOW_WAIT_S`) until there is output past what was read, or the job ended:
        output arrives as soon as it is there, and a quiet job costs few Updates."""
        offset = 0
        while True:
            request = JobRequest(
                job=self.id,
                stream=stream,  # type: ignore[arg-type]
                offset=offset,
                wait_s=self.FOLLOW_WAIT_S,
            )
            out: JobOutputResult = await self.episode._update(
                "job_output", request, JobOutputResult
            )
            data = base64.b64decode(out.data_b64)
            offset = out.offset + len(data)
            if data:
                yield data
            if not out.running and offset >= out.total:
                return

    async def wait(self, timeout_s: float | None = None) -> JobState:
        """Until it ends (or ``timeout_s`` passes: then ``running`` is True)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while True:
            left = self.WAIT_SLICE_S if deadline is None else deadline - loop.time()
            slice_s = max(min(left, self.WAIT_SLICE_S), 0.001)
            request = JobRequest(job=self.id, timeout_s=slice_s)
            state: JobState = await self.episode._update("job_wait", request, JobState)
            if not state.running or (deadline is not None and loop.time() >= deadline):
                return state

    async def send(self, data: bytes | str, *, eof: bool = False) -> None:
        """Bytes for its stdin: keys typed into its terminal when spawned with ``pty``."""
        raw = data.encode() if isinstance(data, str) else data
        request = JobStdinRequest(job=self.id, data_b64=base64.b64encode(raw).decode(), eof=eof)
        await self.episode._update("job_stdin", request, None)

    async def kill(self, signal: int = 9) -> None:
        """Signal the job's whole process tree (SIGKILL by default)."""
        await self.episode._update("job_kill", JobRequest(job=self.id, signal=signal), None)


class Episode:
    """A handle on one episode; cheap, holds nothing but the workflow handle.

    `async with await corral.start_episode(spec) as episode:` finishes the
    episode on a clean exit (runs its reward) and cancels it on an exception.
    """

    def __init__(
        self, handle: WorkflowHandle[Any, Any], corral: Corral | None = None, *, fresh: bool = False
    ) -> None:
        self._handle = handle
        self.id = handle.id
        self._result: EpisodeResult | None = None
        self._corral = corral  # starts the children of `fork`
        self._calls: WorkflowHandle[Any, Any] | None = None  # its calls workflow
        # Just started (`fresh`): its calls workflow starts after its first call, so
        # that one goes to the episode without asking the calls workflow first.
        self._calls_may_run = not fresh

    async def __aenter__(self) -> Episode:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is None:
            await self.close()
            return
        # The body failed: the episode's result means nothing, free the sandbox now.
        with contextlib.suppress(CorralError):
            await self.cancel()

    async def exec(
        self,
        cmd: str | list[str],
        *,
        timeout_s: float | None = None,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        stdin: str | None = None,
        session: str | None = None,
    ) -> StepResult:
        """Run one command in the sandbox and return its result (never raises on exit
        code; a step that runs out of time returns with `timed_out=True`).

        With ``session`` (needs the exec agent, docs/agent.md), the command runs in
        that named shell session: its cwd and exported variables carry over."""
        if session is not None:
            call = ToolExecRequest(
                cmd=cmd,
                session=session,
                timeout_s=timeout_s,
                env=env or {},
                workdir=workdir,
                stdin=stdin,
            )
            session_result: StepResult = await self._update("tool_exec", call, StepResult)
            return session_result
        request = ExecRequest(
            cmd=cmd, timeout_s=timeout_s, env=env or {}, workdir=workdir, stdin=stdin
        )
        result: StepResult = await self._update("exec", request, StepResult)
        return result

    async def spawn(
        self,
        cmd: str | list[str],
        *,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        timeout_s: float | None = None,
        pty: tuple[int, int] | None = None,
    ) -> Job:
        """Start a background job (needs the exec agent, docs/agent.md): it outlives
        this call; read its output, wait for it or kill it (its whole tree) later.
        With ``pty`` (rows, cols) it runs on a terminal that `Job.send` types into."""
        request = SpawnRequest(cmd=cmd, env=env or {}, workdir=workdir, timeout_s=timeout_s)
        if pty is not None:
            request = request.model_copy(update={"pty": True, "rows": pty[0], "cols": pty[1]})
        info: JobInfo = await self._update("spawn", request, JobInfo)
        return Job(self, info.job, info.cmd)

    async def stream(
        self,
        cmd: str | list[str],
        *,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        timeout_s: float | None = None,
    ) -> AsyncGenerator[bytes, None]:
        """Run ``cmd`` as a background job and yield its stdout as it comes (needs the
        exec agent): ``async for chunk in episode.stream("make test"): ...``. Closing
        the stream before its end (``contextlib.aclosing``, or its task cancelled)
        kills the command's whole tree."""
        job = await self.spawn(cmd, env=env, workdir=workdir, timeout_s=timeout_s)
        ended = False
        try:
            async for chunk in job.follow():
                yield chunk
            ended = True
        finally:
            if not ended:
                with contextlib.suppress(CorralError):
                    await asyncio.shield(job.kill())

    async def write_file(self, path: str, content: bytes | str, *, mode: int = 0o644) -> None:
        """Any size: over `INLINE_MAX` bytes the content goes through the stack's registry
        and the episode's history records its digest (sandbox/blobs.py)."""
        data = content.encode() if isinstance(content, str) else content
        if len(data) > INLINE_MAX:
            await self._put_file(path, data, mode)
            return
        request = WriteFileRequest(
            path=path, content_b64=base64.b64encode(data).decode(), mode=mode
        )
        await self._update("write_file", request, None)

    async def read_file(self, path: str, *, max_bytes: int = 1_048_576) -> bytes:
        """The file's bytes; `EpisodeFileNotFound` if it is not a file in the sandbox.
        A `max_bytes` over `INLINE_MAX` reads through the stack's registry (any size)."""
        if max_bytes > INLINE_MAX:
            return await self._get_file(path, max_bytes)
        content: FileContent = await self._update(
            "read_file", ReadFileRequest(path=path, max_bytes=max_bytes), FileContent
        )
        return base64.b64decode(content.content_b64)

    async def _put_file(self, path: str, data: bytes, mode: int) -> None:
        registry = self._registry()
        options = registry_options(registry)
        blob = await push_bytes(files_repository(registry.default), data, options)
        await self._update("put_file", PutFileRequest(path=path, blob=blob, mode=mode), None)

    async def _get_file(self, path: str, max_bytes: int) -> bytes:
        registry = self._registry()
        request = GetFileRequest(
            path=path, repository=files_repository(registry.default), max_bytes=max_bytes
        )
        blob: FileBlob = await self._update("get_file", request, FileBlob)
        return await pull_bytes(blob, registry_options(registry))

    def _registry(self) -> RegistryConfig:
        if self._corral is None:
            raise InvalidEpisodeSpec(
                "files over 1 MiB need the stack's registry: get the episode from a Corral"
            )
        return self._corral.config.registry

    async def finish(self) -> EpisodeResult:
        """End an interactive episode: run its reward, tear down, return the result."""
        await self._update("finish", None, None)
        return await self.result()

    async def close(self) -> EpisodeResult:
        """Finish the episode if it still takes requests, else wait for its end."""
        if self._result is not None:
            return self._result
        try:
            return await self.finish()
        except EpisodeQuarantined:
            raise  # waiting would block until on-call acts
        except EpisodeRejected:
            # Not interactive (it ends by itself) or ended already: its result says how.
            return await self.result()

    async def result(self, *, timeout_s: float | None = None) -> EpisodeResult:
        """Wait for the end; raises the typed `EpisodeError` unless it completed,
        `EpisodeWaitTimedOut` if it still runs after `timeout_s`."""
        try:
            result: EpisodeResult = await asyncio.wait_for(self._handle.result(), timeout_s)
        except TimeoutError as err:
            raise EpisodeWaitTimedOut(
                f"episode {self.id} still runs after {timeout_s:g} s"
            ) from err
        except WorkflowFailureError as err:
            raise _episode_error(self.id, err) from err
        except RPCError as err:
            raise _rpc_error(self.id, err) from err
        self._result = result
        return result

    async def status(self) -> EpisodeStatus:
        """The episode's status, counting the calls its calls workflow ran so far
        (asked second: a call absorbed in between is missed, never counted twice)."""
        status: EpisodeStatus = await self._query(EpisodeWorkflow.status)
        progress = await self._calls_query(EpisodeCallsWorkflow.progress)
        if progress is None:
            return status
        last = status.last_activity
        return status.model_copy(
            update={
                "steps_done": status.steps_done + progress.steps_done,
                "last_activity": max(last, progress.last_call) if last else progress.last_call,
            }
        )

    async def snapshot(self, name: str | None = None) -> SnapshotResult:
        """Commit the sandbox's filesystem as an image (recorded in the episode's
        history); `EpisodeSpec(image=result.ref)` starts new episodes from it."""
        try:
            request = SnapshotRequest(name=name)
        except ValidationError as err:
            raise InvalidEpisodeSpec(
                f"invalid snapshot name {name!r}: up to 128 letters, digits, '_', '.' or '-', "
                "not starting with '.' or '-'"
            ) from err
        result: SnapshotResult = await self._update("snapshot", request, SnapshotResult)
        return result

    async def fork(
        self, n: int, steps: list[str | list[str]] | None = None, **changes: Any
    ) -> list[Episode]:
        """`n` new episodes that start from this episode's filesystem now; this one goes on.

        Each child is a durable episode with its own sandbox, placed like any
        episode, with this episode's spec (`changes` override fields) and
        image = a snapshot taken now; its services start from their own
        snapshots, taken at the same moment. Given `steps`, the children run them
        (then the reward); else they are interactive. Lineage: each child's
        `ParentEpisode` search attribute and memo name this episode.
        """
        if self._corral is None:
            raise InvalidEpisodeSpec("fork needs an episode handle from Corral (start_episode)")
        if n < 1:
            raise InvalidEpisodeSpec(f"fork n must be at least 1, got {n}")
        tag = uuid.uuid4().hex[:8]
        # The spec does not change with the snapshot: read both at once.
        snap, parent = await asyncio.gather(
            self.snapshot(f"fork-{tag}"), self._query(EpisodeWorkflow.spec)
        )
        fields = {
            **parent.model_dump(exclude={"files", "steps", "interactive"}),
            "services": [
                {**service.model_dump(), "image": snap.services.get(service.name, service.image)}
                for service in parent.services
            ],
            "image": snap.ref,
            "steps": steps or [],
            "interactive": steps is None,
            "parent_episode": self.id,
            **changes,
        }
        spec = parse_spec(fields)
        corral = self._corral
        return list(
            await asyncio.gather(
                *(corral.start_episode(spec, episode_id=f"{self.id}-{tag}-{i}") for i in range(n))
            )
        )

    async def steps(self) -> list[StepResult]:
        """The step log, with the calls its calls workflow ran so far."""
        steps: list[StepResult] = await self._query(EpisodeWorkflow.steps)
        by_index = {step.index: step for step in steps}
        for step in await self._calls_steps():
            by_index[step.index] = step
        return sorted(by_index.values(), key=lambda step: step.index)

    async def _calls_steps(self) -> list[StepResult]:
        """Its calls workflow's steps while it runs (after, the episode holds them)."""
        return await self._calls_query(EpisodeCallsWorkflow.steps) or []

    async def _calls_query(self, query: Callable[[Any], T]) -> T | None:
        """A query on its calls workflow while that runs; None when it does not
        (never started, closed and absorbed by the episode) or its node does not answer."""
        calls = self._calls_handle()
        try:
            desc = await calls.describe()
            if desc.status != Status.RUNNING:
                return None
            answer: T = await calls.query(query, rpc_timeout=timedelta(seconds=10))
        except (RPCError, WorkflowQueryFailedError):
            return None
        return answer

    async def kill(self, reason: str = "", by: str = "") -> None:
        await self._signal("kill", OnCallRequest(reason=reason, by=by))

    async def release(self, reason: str = "", by: str = "") -> None:
        await self._signal("release", OnCallRequest(reason=reason, by=by))

    async def cancel(self) -> None:
        try:
            await self._handle.cancel()
        except RPCError as err:
            raise _rpc_error(self.id, err) from err

    async def _query(self, query: Any) -> Any:
        try:
            return await self._handle.query(query)
        except WorkflowQueryFailedError as err:
            raise CorralRPCError(f"episode {self.id}: query failed: {err.message}") from err
        except RPCError as err:
            raise _rpc_error(self.id, err) from err

    async def _signal(self, name: str, arg: OnCallRequest) -> None:
        try:
            await self._handle.signal(name, arg)
        except RPCError as err:
            raise _rpc_error(self.id, err) from err

    async def _update(self, name: str, arg: Any, result_type: type | None) -> Any:
        if name not in _CALLS:
            return await self._episode_update(name, arg, result_type)
        # A tool call goes to the episode's calls workflow on its node while that
        # runs (workflows/calls.py), else to the episode; the two hand over in
        # turn, so a call that meets the hand-over asks again.
        for attempt in range(_CALL_ROUTE_ATTEMPTS):
            if (
                self._calls_may_run
                and (sent := await self._calls_update(name, arg, result_type)) is not _NOT_THERE
            ):
                return sent
            try:
                answer = await self._episode_update(name, arg, result_type)
            except EpisodeRequestFailed as err:
                if err.error_type not in _HANDED_OVER:
                    raise
            else:
                self._calls_may_run = True  # from now on it may
                return answer
            self._calls_may_run = True
            await asyncio.sleep(min(0.02 * (attempt + 1), 0.2))
        raise EpisodeRequestFailed(
            f"episode {self.id} {name}: its calls workflow did not take the call", "CallsOnNode"
        )

    def _calls_handle(self) -> WorkflowHandle[Any, Any]:
        if self._calls is None:
            client = self._corral.client if self._corral else self._handle._client
            self._calls = client.get_workflow_handle(calls_workflow_id(self.id))
        return self._calls

    async def _calls_update(self, name: str, arg: Any, result_type: type | None) -> Any:
        """The calls workflow's answer, or `_NOT_THERE` when it does not run."""
        try:
            return await self._calls_handle().execute_update(
                name, args=[arg], result_type=result_type
            )
        except WorkflowUpdateFailedError as err:
            cause = _innermost(err)
            if isinstance(cause, ApplicationError) and cause.type in _CALLS_GONE:
                return _NOT_THERE
            raise _update_error(self.id, name, cause) from err
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:  # never started, or closed
                return _NOT_THERE
            raise _rpc_error(self.id, err) from err

    async def _episode_update(self, name: str, arg: Any, result_type: type | None) -> Any:
        try:
            args = [] if arg is None else [arg]
            return await self._handle.execute_update(name, args=args, result_type=result_type)
        except WorkflowUpdateFailedError as err:
            cause = _innermost(err)
            if isinstance(cause, ApplicationError) and cause.type in _CLOSED_UNDER_UPDATE:
                raise await self._ended() from err
            raise _update_error(self.id, name, cause) from err
        except RPCError as err:
            # The server answers NOT_FOUND for an Update to a closed workflow too:
            # that episode exists, it just takes no more requests.
            if err.status == RPCStatusCode.NOT_FOUND and await self._is_closed():
                raise await self._ended() from err
            raise _rpc_error(self.id, err) from err

    async def _is_closed(self) -> bool:
        try:
            desc = await self._handle.describe()
        except RPCError:
            return False
        return desc.status is not None and desc.status != Status.RUNNING

    async def _ended(self) -> EpisodeEnded:
        """How and why the (closed) episode ended, from its result."""
        try:
            result = await self.result()
        except EpisodeError as err:
            outcome = err.result.outcome if err.result is not None else err.outcome
            return EpisodeEnded(self.id, outcome, str(err))
        return EpisodeEnded(self.id, result.outcome, result.reason)


class Corral:
    """A connection to Corral's Temporal namespace, with the stack's settings."""

    def __init__(self, client: Client, config: StackConfig) -> None:
        self.client = client
        self.config = config

    @classmethod
    async def connect(cls, config: StackConfig | None = None) -> Corral:
        config = config or load_config()
        # The client's span starts each episode's trace; workers continue it.
        setup_tracing(
            "corral-client",
            exporter=config.observability.traces,
            path=config.traces_file,
            otlp_endpoint=config.observability.otlp_endpoint,
        )
        return cls(await connect(config), config)

    async def __aenter__(self) -> Corral:
        return self

    async def __aexit__(self, *exc: object) -> None:
        flush_tracing()

    def _input(self, spec: EpisodeSpec, node: str | None) -> EpisodeInput:
        try:
            spec, admission = prepare_for_tenant(self.config, spec)
        except TenantRuleViolation as err:
            raise EpisodeNotAdmitted(str(err)) from err
        return EpisodeInput(
            spec=spec,
            node_task_queue_prefix=self.config.workers.node_task_queue_prefix,
            node=node,
            admission=admission,
        )

    async def start_episode(
        self,
        spec: EpisodeSpec | dict[str, Any],
        *,
        episode_id: str | None = None,
        node: str | None = None,
    ) -> Episode:
        spec = parse_spec(spec)
        if node is not None and node not in self.config.node_names():
            raise InvalidEpisodeSpec(
                f"node {node!r} is not one of {', '.join(self.config.node_names())}"
            )
        episode_id = episode_id or f"ep-{uuid.uuid4().hex[:16]}"
        try:
            handle = await self._start(spec, episode_id, node)
        except WorkflowAlreadyStartedError as err:
            raise EpisodeAlreadyExists(f"episode {episode_id!r} exists already") from err
        except RPCError as err:
            raise _rpc_error(episode_id, err) from err
        return Episode(handle, self, fresh=True)

    async def _start(
        self, spec: EpisodeSpec, episode_id: str, node: str | None
    ) -> WorkflowHandle[Any, Any]:
        steps = len(spec.steps)
        summary = f"{spec.image}: {steps} step{'s' * (steps != 1)}" + (
            ", interactive" if spec.interactive else ""
        )
        lineage = spec.parent_episode
        return await self.client.start_workflow(
            EpisodeWorkflow.run,
            self._input(spec, node),
            id=episode_id,
            task_queue=self.config.workers.workflow_task_queue,
            search_attributes=TypedSearchAttributes(
                [
                    SearchAttributePair(EPISODE_STATE, "provisioning"),
                    SearchAttributePair(TENANT, spec.tenant),
                    SearchAttributePair(SANDBOX_IMAGE, spec.image),
                    *([SearchAttributePair(PARENT_EPISODE, lineage)] if lineage else []),
                ]
            ),
            memo={"parent_episode": lineage} if lineage else None,
            static_summary=summary,
            static_details=f"tenant `{spec.tenant}`; labels {spec.labels or '{}'}",
        )

    def episode(self, episode_id: str) -> Episode:
        # Typed, so that `result()` decodes an EpisodeResult rather than a dict.
        handle = self.client.get_workflow_handle_for(EpisodeWorkflow.run, episode_id)
        return Episode(handle, self)

    async def run_episode(self, spec: EpisodeSpec | dict[str, Any], **kwargs: Any) -> EpisodeResult:
        """Start one episode and wait for its result (raises unless it completed)."""
        episode = await self.start_episode(spec, **kwargs)
        return await episode.result()

    async def run_batch(
        self,
        spec: EpisodeSpec | dict[str, Any],
        *,
        n: int,
        concurrency: int,
        id_prefix: str | None = None,
    ) -> AsyncIterator[EpisodeResult]:
        """Run `n` episodes, at most `concurrency` at once, yielding results as they end.

        Failed, killed and timed-out episodes are yielded too (see `outcome`);
        a batch never stops at the first failure.
        """
        spec = parse_spec(spec)
        if n < 1 or concurrency < 1:
            raise InvalidEpisodeSpec("n and concurrency must be at least 1")
        prefix = id_prefix or f"batch-{uuid.uuid4().hex[:10]}"
        queue: asyncio.Queue[EpisodeResult] = asyncio.Queue()
        limit = asyncio.Semaphore(concurrency)

        async def one(index: int) -> None:
            async with limit:
                queue.put_nowait(await self._batch_episode(spec, f"{prefix}-{index:06d}"))

        tasks = [asyncio.create_task(one(i)) for i in range(n)]
        try:
            for _ in range(n):
                yield await queue.get()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _batch_episode(self, spec: EpisodeSpec, episode_id: str) -> EpisodeResult:
        try:
            return await self.run_episode(spec, episode_id=episode_id)
        except EpisodeError as err:
            return err.result or EpisodeResult(
                episode_id=episode_id, outcome="failed", reason=str(err), image=spec.image
            )
        except Exception as err:
            return EpisodeResult(
                episode_id=episode_id,
                outcome="failed",
                reason=" ".join(str(err).split())[:300],
                image=spec.image,
            )

    async def list_episodes(
        self, query: str | None = None, limit: int = 100, *, parent: str | None = None
    ) -> list[EpisodeSummary]:
        """Episodes from Temporal's visibility, newest first (a List Filter `query`);
        `parent` keeps the episodes forked from that one."""
        base = "WorkflowType = 'EpisodeWorkflow'"
        if parent is not None:
            base += f" AND ParentEpisode = '{_quoted(parent)}'"
        full = f"{base} AND ({query})" if query else base
        try:
            return [_summary(wf) async for wf in self.client.list_workflows(full, limit=limit)]
        except RPCError as err:
            raise _temporal_error(f"list {query or 'all'!r}", err) from err

    async def is_running(self, episode_id: str) -> bool:
        try:
            desc = await self.client.get_workflow_handle(episode_id).describe()
        except RPCError as err:
            raise _rpc_error(episode_id, err) from err
        return desc.status == Status.RUNNING


def _summary(wf: WorkflowExecution) -> EpisodeSummary:
    attrs = wf.typed_search_attributes
    return EpisodeSummary(
        episode_id=wf.id,
        status=wf.status.name if wf.status else "UNKNOWN",
        state=attrs.get(EPISODE_STATE) or "",
        image=attrs.get(SANDBOX_IMAGE) or "",
        tenant=attrs.get(TENANT) or "",
        node=attrs.get(SANDBOX_NODE) or "",
        anomaly_rules=list(attrs.get(ANOMALY_RULE) or []),
        start_time=wf.start_time,
        close_time=wf.close_time,
        parent_episode=attrs.get(PARENT_EPISODE) or "",
    )


def _quoted(value: str) -> str:
    """A value inside a single-quoted List Filter string."""
    return value.replace("\\", "\\\\").replace("'", "\\'")


def _episode_error(episode_id: str, err: WorkflowFailureError) -> EpisodeError:
    cause = err.cause
    if isinstance(cause, CancelledError):
        return EpisodeCancelled(f"episode {episode_id} was cancelled")
    if isinstance(cause, TerminatedError):
        return EpisodeTerminated(f"episode {episode_id} was terminated: {cause.message}")
    if isinstance(cause, ApplicationError):
        result = _result_from_details(cause)
        kind = _ERROR_TYPES.get(cause.type or "", EpisodeFailed)
        if result is not None and result.outcome == "timed_out":
            kind = EpisodeTimedOut
        return kind(cause.message, result)
    return EpisodeFailed(f"episode {episode_id} failed: {cause or err}")


def _innermost(err: BaseException) -> BaseException:
    """The root of a Temporal failure chain (update -> activity -> application)."""
    while getattr(err, "cause", None) is not None:
        err = err.cause  # type: ignore[attr-defined]
    return err


def _update_error(episode_id: str, name: str, cause: BaseException) -> CorralError:
    """What a failed Update means to the trainer: a refusal, or the sandbox's cause."""
    if isinstance(cause, TemporalTimeoutError):
        return EpisodeRequestTimedOut(f"episode {episode_id} {name}: timed out", "Timeout")
    if not isinstance(cause, ApplicationError):
        return EpisodeRequestFailed(f"episode {episode_id} {name}: {cause}")
    error_type = cause.type or ""
    if error_type == "EpisodeEnded":
        ended = _ended_details(cause)
        return EpisodeEnded(episode_id, ended.get("outcome") or "ended", ended.get("reason", ""))
    if error_type == "EpisodeQuarantined":
        return EpisodeQuarantined(cause.message)
    if error_type in _REFUSALS:
        return EpisodeRejected(f"episode {episode_id} refused {name}: {cause.message}")
    kind = EpisodeFileNotFound if error_type == "FileNotFound" else EpisodeRequestFailed
    return kind(cause.message, error_type)


def _ended_details(cause: ApplicationError) -> dict[str, str]:
    """How the episode ended, from the refusal's details (`outcome`, `reason`)."""
    details = cause.details[0] if cause.details else None
    return {k: str(v) for k, v in details.items()} if isinstance(details, dict) else {}


def _result_from_details(cause: ApplicationError) -> EpisodeResult | None:
    if not cause.details:
        return None
    try:
        return EpisodeResult.model_validate(cause.details[0])
    except ValidationError:
        return None


def _rpc_error(episode_id: str, err: RPCError) -> CorralError:
    if err.status == RPCStatusCode.NOT_FOUND:
        return EpisodeNotFound(f"no episode {episode_id!r}")
    return _temporal_error(f"episode {episode_id}", err)


def _temporal_error(what: str, err: RPCError) -> CorralRPCError:
    status = err.status.name if err.status is not None else "error"
    return CorralRPCError(f"{what}: Temporal said {status}: {err.message}", err)


__all__ = ["Corral", "Episode", "EpisodeSummary", "parse_spec"]
