"""Node activities: the thin Temporal layer over one node's sandbox runtime.

Every activity here runs on the node's own task queue (`corral-node-<name>`),
because a sandbox exists on exactly one host. Each is idempotent by sandbox
id, heartbeats while it waits, and turns sandbox errors into Temporal
`ApplicationError`s whose `type` is the error class name, so the workflow's
retry policy can mark the hopeless ones (bad spec, missing image)
non-retryable (activities/glue.py).

`NodeActivities` is the one class a node worker registers; it names the
activities (their names are in recorded histories) and hands each to the
module of its concern:

- provision and teardown: activities/lifecycle.py
- freeze and thaw: activities/quarantine.py
- exec_step and its journal: activities/step_exec.py
- write_file, read_file: activities/files.py
- run_scripted, the lean path: activities/lean.py (runs by workflow run id:
  activities/episode_runs.py)
- reap_orphans: activities/reaping.py
- the node's ledger and CPU weights: activities/ledger.py; records:
  activities/records.py

It programs against `sandbox.runtime.SandboxRuntime`: a node worker passes
its `Containerd`, unit tests `sandbox.fake.FakeRuntime`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.client import Client

from activities.capacity import node_capacity
from activities.episode_runs import EpisodeRuns
from activities.files import SandboxFiles
from activities.foreground import Foreground
from activities.gateway import NodeGateway
from activities.lean import DRAIN_TIMEOUT_S, LeanRuns
from activities.ledger import NodeLedger
from activities.lifecycle import Lifecycle
from activities.pool import WarmPool
from activities.quarantine import Quarantine
from activities.reaping import Reaper
from activities.sensorwatch import SensorWatch, Verdict
from activities.step_exec import StepRunner
from contract.models import (
    ExecStepInput,
    FileContent,
    NodeCapacity,
    NodeUsage,
    ProvisionInput,
    ProvisionResult,
    ReadFileInput,
    ReapInput,
    ReapResult,
    RunScriptedInput,
    RunScriptedResult,
    SandboxRef,
    StepResult,
    TeardownInput,
    TeardownResult,
    WriteFileInput,
)
from observability.metrics import Metrics
from observability.records import RecordWriter
from sandbox.registry import RegistryOptions
from sandbox.runtime import SandboxRuntime


class NodeActivities:
    """One instance per node worker, holding that node's sandbox runtime."""

    def __init__(
        self,
        node: str,
        containerd: SandboxRuntime,
        state_dir: Path,
        *,
        temporal: Client | None = None,
        records: RecordWriter | None = None,
        metrics: Metrics | None = None,
        pool: WarmPool | None = None,
        capacity: NodeCapacity | None = None,
        registry: RegistryOptions | None = None,
        fetch_image: Callable[[str], Awaitable[bool]] | None = None,
        foreground: Foreground | None = None,
        sensor: SensorWatch | None = None,
        gateway: NodeGateway | None = None,
    ) -> None:
        self.node = node
        self.capacity = capacity or node_capacity()
        # Steps hold it; background teardowns wait for it (activities/foreground.py).
        foreground = foreground or Foreground()
        self._ledger = NodeLedger(node, containerd, self.capacity, state_dir, foreground)
        runs = EpisodeRuns()
        self._steps = StepRunner(
            node,
            containerd,
            state_dir,
            self._ledger,
            sensor=sensor,
            gateway=gateway,
            metrics=metrics,
        )
        self._lifecycle = Lifecycle(
            node,
            containerd,
            self._ledger,
            runs,
            self._steps,
            pool=pool,
            registry=registry,
            fetch_image=fetch_image,
            gateway=gateway,
            metrics=metrics,
            records=records,
        )
        self._quarantine = Quarantine(node, containerd, self._lifecycle.resolve, metrics)
        self._files = SandboxFiles(containerd, self._ledger)
        self._lean = LeanRuns(
            containerd, runs, self._lifecycle, self._steps, self._files, foreground
        )
        self._reaper = Reaper(node, containerd, temporal, self._lifecycle.teardown)

    # ------------------------------------------------------------ lifecycle
    @activity.defn(name="corral.provision")
    async def provision(self, input: ProvisionInput) -> ProvisionResult:
        return await self._lifecycle.provision(input)

    @activity.defn(name="corral.teardown")
    async def teardown(self, input: TeardownInput) -> TeardownResult:
        return await self._lifecycle.teardown(input)

    @activity.defn(name="corral.freeze")
    async def freeze(self, input: SandboxRef) -> None:
        await self._quarantine.freeze(input)

    @activity.defn(name="corral.thaw")
    async def thaw(self, input: SandboxRef) -> None:
        await self._quarantine.thaw(input)

    # ----------------------------------------------------------------- steps
    @activity.defn(name="corral.exec_step")
    async def exec_step(self, input: ExecStepInput) -> StepResult:
        return await self._steps.exec_step(input)

    @activity.defn(name="corral.run_scripted")
    async def run_scripted(self, input: RunScriptedInput) -> RunScriptedResult:
        return await self._lean.run_scripted(input)

    # ----------------------------------------------------------------- files
    @activity.defn(name="corral.write_file")
    async def write_file(self, input: WriteFileInput) -> None:
        await self._files.write_file(input)

    @activity.defn(name="corral.read_file")
    async def read_file(self, input: ReadFileInput) -> FileContent:
        return await self._files.read_file(input)

    # --------------------------------------------------------------- janitor
    @activity.defn(name="corral.reap_orphans")
    async def reap_orphans(self, input: ReapInput) -> ReapResult:
        return await self._reaper.reap_orphans(input)

    # ------------------------------------------------------- the node worker's
    async def use(self) -> NodeUsage:
        """What this node uses now and whether it admits more (heartbeats carry it)."""
        return await self._ledger.use()

    async def settle(self, sandbox_id: str, gaps: int | None = None) -> Verdict:
        """Until the sensor has judged the sandbox's events so far (bounded)."""
        return await self._steps.settle(sandbox_id, gaps)

    async def drain(self, timeout_s: float = DRAIN_TIMEOUT_S) -> None:
        """Let deferred teardowns finish before the worker goes (the janitor
        reaps what does not finish in time)."""
        await self._lean.drain(timeout_s)

    def activities(self) -> list[Any]:
        return [
            self.provision,
            self.teardown,
            self.freeze,
            self.thaw,
            self.exec_step,
            self.run_scripted,
            self.write_file,
            self.read_file,
            self.reap_orphans,
        ]
