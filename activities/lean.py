"""The lean path: a scripted episode in one activity, `corral.run_scripted`.

One round trip: provision, the spec's files, the steps and the reward, each
step journaled as in `exec_step` (a retry after a crash answers finished
steps from the journal and reattaches a running one). A quarantine freezes
the sandbox between or during steps; the next step waits for the thaw. The
sandbox is destroyed after the result has gone back, off the critical path
and after the node's steps (activities/foreground.py); if this worker dies
first, the janitor reaps it. The run is registered under its workflow run
id (activities/episode_runs.py): the episode's teardown stops it.
"""

from __future__ import annotations

import asyncio
import logging

from activities.episode_runs import EpisodeRuns
from activities.files import SandboxFiles
from activities.foreground import Foreground
from activities.glue import heartbeat, mapped, uncut, workflow_run_id
from activities.lifecycle import Lifecycle
from activities.step_exec import StepRunner
from contract.models import (
    ExecStepInput,
    RunScriptedInput,
    RunScriptedResult,
    Step,
    StepResult,
    TeardownInput,
    WriteFileInput,
)
from contract.script import reward_due, run_steps
from sandbox.runtime import SandboxRuntime

# A lean run's own teardown is tried this often before leaving it to the janitor.
DESTROY_ATTEMPTS = 3
DRAIN_TIMEOUT_S = 30.0  # a stopping worker waits this long for its deferred teardowns
THAW_POLL_S = 0.2
log = logging.getLogger("corral.node")


class LeanRuns:
    def __init__(
        self,
        runtime: SandboxRuntime,
        runs: EpisodeRuns,
        lifecycle: Lifecycle,
        steps: StepRunner,
        files: SandboxFiles,
        foreground: Foreground,
    ) -> None:
        self._runtime = runtime
        self._runs = runs
        self._lifecycle = lifecycle
        self._steps = steps
        self._files = files
        self._foreground = foreground
        self._background: set[asyncio.Task[None]] = set()  # teardowns after lean runs

    async def run_scripted(self, input: RunScriptedInput) -> RunScriptedResult:
        """The episode's lean run, registered under its workflow run id."""
        run_id = workflow_run_id()
        if not run_id:  # called outside an activity (tests, bench)
            return await self.run(input)
        return await self._runs.run_lean(run_id, lambda: self.run(input))

    async def run(self, input: RunScriptedInput) -> RunScriptedResult:
        provision = await uncut(self._lifecycle.provision(input.provision))
        sandbox_id = provision.sandbox_id
        for request in input.files:
            await self._files.write_file(WriteFileInput(sandbox_id=sandbox_id, request=request))
        steps = await run_steps(
            input.steps,
            first_index=input.first_index,
            idempotent_steps=input.idempotent_steps,
            run=lambda step, index: self._step(input, sandbox_id, step, index, "scripted"),
        )
        reward = None
        if input.reward is not None and reward_due(steps):
            index = input.first_index + len(steps)
            reward = await self._step(input, sandbox_id, input.reward, index, "reward")
        if self._steps.last_verdict(sandbox_id).stops_episode:
            # An alert will kill or quarantine the episode: its sandbox stays
            # (frozen) for the episode's own freeze and teardown.
            return RunScriptedResult(
                provision=provision, steps=steps, reward=reward, torn_down=False
            )
        self._destroy_soon(sandbox_id)
        return RunScriptedResult(provision=provision, steps=steps, reward=reward)

    async def _step(
        self, input: RunScriptedInput, sandbox_id: str, step: Step, index: int, source: str
    ) -> StepResult:
        await self._until_thawed(sandbox_id)
        return await self._steps.exec_step(
            ExecStepInput(
                sandbox_id=sandbox_id,
                step=step,
                index=index,
                source=source,  # type: ignore[arg-type]
                default_timeout_s=input.default_timeout_s,
                output_limit_bytes=input.output_limit_bytes,
                base_env=input.base_env,
            )
        )

    async def _until_thawed(self, sandbox_id: str) -> None:
        """A quarantined sandbox runs no new step until on-call releases it."""
        sandbox = await mapped(self._runtime.get_sandbox(sandbox_id))
        while await sandbox.status() == "paused":
            heartbeat("quarantined")
            await asyncio.sleep(THAW_POLL_S)

    async def drain(self, timeout_s: float = DRAIN_TIMEOUT_S) -> None:
        """Let deferred teardowns finish before the worker goes (the janitor
        reaps what does not finish in time)."""
        if self._background:
            await asyncio.wait(set(self._background), timeout=timeout_s)

    def _destroy_soon(self, sandbox_id: str) -> None:
        """Tear down off the episode's critical path (the janitor is the backstop)."""
        task = asyncio.create_task(self._destroy_quietly(sandbox_id))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _destroy_quietly(self, sandbox_id: str) -> None:
        await self._foreground.quiet()
        for attempt in range(1, DESTROY_ATTEMPTS + 1):
            try:
                await self._lifecycle.teardown(TeardownInput(sandbox_id=sandbox_id))
                return
            except Exception as err:  # a busy containerd: once more, then the janitor
                log.warning(
                    "teardown of %s after its lean run failed (attempt %d): %s",
                    sandbox_id,
                    attempt,
                    err,
                )
                if attempt < DESTROY_ATTEMPTS:
                    await asyncio.sleep(attempt)
