"""An interactive episode's tool calls as Updates on the episode: `exec`,
`tool_exec`, `spawn` and the `job_*` calls (each a step in the episode's log
or a job's operation, run by a node activity), and `finish`. While the calls
workflow runs on the node the SDK sends the calls there, and these refuse
them with `CallsOnNode`.

A request that cannot run fails with an ApplicationError whose type the SDK
maps to a trainer exception: EpisodeEnded, EpisodeQuarantined,
EpisodeFinishing, or the sandbox layer's error (FileNotFound, ...).
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.toolcalls import (
        JobInfo,
        JobInput,
        JobOutputResult,
        JobRequest,
        JobState,
        JobStdinInput,
        JobStdinRequest,
        SpawnInput,
        SpawnRequest,
        ToolCallActivities,
        ToolExecInput,
        ToolExecRequest,
    )
    from contract.models import ExecRequest, StepResult
    from workflows.episode_body import EpisodeBody
    from workflows.steps import surfaced


class EpisodeRequests(EpisodeBody):
    @workflow.update(name="exec")
    async def exec_update(self, request: ExecRequest) -> StepResult:
        async with self._request_turn():
            return await surfaced(self._run_step(request.as_step(), "interactive"))

    @exec_update.validator
    def _validate_exec(self, request: ExecRequest) -> None:
        self._check_open()
        self._check_calls_here()

    # Tool calls through the exec agent (activities/toolcalls.py, docs/agent.md).
    @workflow.update(name="tool_exec")
    async def tool_exec_update(self, request: ToolExecRequest) -> StepResult:
        """An exec in a named session (cwd and exported variables carry over)."""
        async with self._request_turn():
            index = self._claim_index()
            timeout_s = request.timeout_s or self._spec.timeouts.step_s
            call = ToolExecInput(
                sandbox_id=self._s.sandbox_id,
                index=index,
                request=request,
                default_timeout_s=self._spec.timeouts.step_s,
                output_limit_bytes=self._spec.output_limit_bytes,
                base_env=self._spec.env,
            )
            result: StepResult = await surfaced(
                self._node_activity(ToolCallActivities.tool_exec, call, timeout_s=timeout_s + 60)
            )
            return self._record_step(result)

    @tool_exec_update.validator
    def _validate_tool_exec(self, request: ToolExecRequest) -> None:
        self._check_open()
        self._check_calls_here()

    @workflow.update(name="spawn")
    async def spawn_update(self, request: SpawnRequest) -> JobInfo:
        """A background job: it outlives the call; read, wait for and kill it by id."""
        async with self._request_turn():
            index = self._claim_index()
            call = SpawnInput(
                sandbox_id=self._s.sandbox_id, index=index, request=request, base_env=self._spec.env
            )
            info: JobInfo = await surfaced(
                self._node_activity(ToolCallActivities.job_spawn, call, timeout_s=60)
            )
            return info

    @spawn_update.validator
    def _validate_spawn(self, request: SpawnRequest) -> None:
        self._check_open()
        self._check_calls_here()

    @workflow.update(name="job_output")
    async def job_output_update(self, request: JobRequest) -> JobOutputResult:
        self._check_open()
        self._touch()
        call = JobInput(sandbox_id=self._s.sandbox_id, request=request)
        out: JobOutputResult = await surfaced(
            self._node_activity(ToolCallActivities.job_output, call, timeout_s=60)
        )
        return out

    @workflow.update(name="job_wait")
    async def job_wait_update(self, request: JobRequest) -> JobState:
        self._check_open()
        self._touch()
        call = JobInput(sandbox_id=self._s.sandbox_id, request=request)
        timeout_s = (request.timeout_s or 0) + 60
        state: JobState = await surfaced(
            self._node_activity(ToolCallActivities.job_wait, call, timeout_s=timeout_s)
        )
        return state

    @workflow.update(name="job_stdin")
    async def job_stdin_update(self, request: JobStdinRequest) -> None:
        """Typed into a job's terminal (`corral episode shell`) or piped to its stdin."""
        self._check_open()
        self._touch()
        call = JobStdinInput(sandbox_id=self._s.sandbox_id, request=request)
        await surfaced(self._node_activity(ToolCallActivities.job_stdin, call, timeout_s=60))

    @workflow.update(name="job_kill")
    async def job_kill_update(self, request: JobRequest) -> None:
        self._check_open()
        self._touch()
        call = JobInput(sandbox_id=self._s.sandbox_id, request=request)
        await surfaced(self._node_activity(ToolCallActivities.job_kill, call, timeout_s=60))

    @workflow.update
    async def finish(self) -> None:
        """Ask the episode to compute its reward and end; returns at once."""
        self._s.finishing = True
        self._touch()

    @finish.validator
    def _validate_finish(self) -> None:
        if not self._spec.interactive:
            raise ApplicationError(
                "episode is not interactive: it finishes by itself", type="InvalidRequest"
            )
        self._check_open()
