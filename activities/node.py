"""Node activities: the thin Temporal layer over one node's containerd.

Every activity here runs on the node's own task queue (`corral-node-<name>`),
because a sandbox exists on exactly one host. Each is idempotent by sandbox
id, heartbeats while it waits, and turns sandbox errors into Temporal
`ApplicationError`s whose `type` is the error class name, so the workflow's
retry policy can mark the hopeless ones (bad spec, missing image) non-retryable.

The step journal makes a retried `exec_step` safe: a step whose result was
journalled is answered from the journal, and a step that was interrupted by a
worker crash is reported as interrupted instead of being run a second time.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import shutil
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from activities.capacity import (
    AdmissionGate,
    SandboxCpuMeter,
    measure,
    node_capacity,
    room_for,
)
from activities.foreground import Foreground
from activities.gateway import NodeGateway
from activities.models import (
    API_KEY_ENV,
    EpisodeSpec,
    ExecStepInput,
    FileContent,
    ModelCall,
    NodeCapacity,
    NodeUsage,
    ProvisionInput,
    ProvisionResult,
    ProvisionSource,
    ReadFileInput,
    ReapInput,
    ReapResult,
    RecordEpisodeInput,
    RunScriptedInput,
    RunScriptedResult,
    SandboxRef,
    Step,
    StepResult,
    TeardownInput,
    TeardownResult,
    WriteFileInput,
)
from activities.pool import WarmPool
from activities.sensorwatch import SensorDown, SensorWatch, Verdict
from activities.services import start_services, stop_services
from observability.metrics import Metrics
from observability.records import AlertRecord, EpisodeAlert, EpisodeRecord, RecordWriter, StepRecord
from observability.tracing import ATTR_NODE, ATTR_SANDBOX_ID, span
from sandbox import Containerd, ExecResult, SandboxSpec, network
from sandbox.cgroups import IDLE_SHARES, ElasticCpu, busy_shares, ceiling_cores
from sandbox.errors import CorralError, ImageNotFound, SandboxError, SandboxNotFound
from sandbox.labels import CPU_MODE_LABEL, NODE_LABEL, OWNER_LABEL, SERVICE_OF_LABEL
from sandbox.registry import RegistryOptions
from sandbox.userns import range_for_tenant

T = TypeVar("T")
HEARTBEAT_EVERY_S = 5.0
# A teardown waits this long for the lean run it stops to unwind.
LEAN_STOP_WAIT_S = 30.0
# A lean run's own teardown is tried this often before leaving it to the janitor.
DESTROY_ATTEMPTS = 3
DRAIN_TIMEOUT_S = 30.0  # a stopping worker waits this long for its deferred teardowns
# Closed episode runs remembered per node (a late lean run of one is refused).
CLOSED_RUNS_KEPT = 10_000
log = logging.getLogger("corral.node")
INTERRUPTED_EXIT_CODE = 255


def sandbox_spec_for(spec: EpisodeSpec, labels: dict[str, str]) -> SandboxSpec:
    """The episode's resources and environment as the sandbox layer's spec.

    Elastic CPU: the sandbox starts at the minimal weight and gets its full
    weight only while a step runs (`ElasticCpu.busy`), unless its spec asks
    for a hard quota, which keeps the full weight and is labelled so."""
    reserved = spec.resources.hard_cpu_quota
    if reserved:
        labels = {**labels, CPU_MODE_LABEL: "reserved"}
    try:
        return SandboxSpec(
            image=spec.image,
            cpu_cores=spec.resources.cpu_cores,
            cpu_shares=busy_shares(spec.resources.cpu_cores) if reserved else IDLE_SHARES,
            memory_mb=spec.resources.memory_mb,
            pids_limit=spec.resources.pids_limit,
            nofile=spec.resources.nofile,
            tmpfs_mb=spec.resources.tmpfs_mb,
            disk_mb=spec.resources.disk_mb,
            io_bps_mb=spec.resources.io_bps_mb,
            io_iops=spec.resources.io_iops,
            env=spec.env,
            runtime=spec.runtime,
            labels=labels,
            network=spec.network.mode,
            egress=[network.EgressRule(**rule.model_dump()) for rule in spec.network.egress],
            egress_mbit=spec.network.egress_mbit,
            user_namespace=spec.user_namespace,
            userns_range=range_for_tenant(spec.tenant),
            exec_agent=spec.exec_agent,
        )
    except ValueError as err:
        raise _app_error_from_message("InvalidSpec", f"invalid episode spec: {err}") from err


class NodeActivities:
    """One instance per node worker, holding that node's containerd client."""

    def __init__(
        self,
        node: str,
        containerd: Containerd,
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
        # The model gateway on the loopback of sandboxes that ask for it.
        self._gateway = gateway
        # The node's sensor: watching before a command starts, its events
        # judged before the result returns (activities/sensorwatch.py).
        self._sensor = sensor
        self._verdicts: dict[str, Verdict] = {}  # a lean run's last step's, by sandbox
        # Steps hold it; background teardowns wait for it (activities/foreground.py).
        self._foreground = foreground or Foreground()
        # Brings a snapshot made on a sibling node here (activities/snapshots.py).
        self._fetch_image = fetch_image
        self._registry = registry or RegistryOptions()
        self.capacity = capacity or node_capacity()
        # Measured limits with hysteresis: heartbeats and provisions judge alike.
        self._gate = AdmissionGate(self.capacity)
        self._sandbox_cpu = SandboxCpuMeter()
        self._cpu = ElasticCpu()
        # This node's episode sandboxes and their CPU ceilings (the nominal CPU
        # committed); filled from containerd on first use, then kept in step.
        self._ceilings: dict[str, float] | None = None
        self._containerd = containerd
        self._state_dir = state_dir
        self._temporal = temporal
        self._records = records
        self._metrics = metrics
        self._pool = pool
        self._sandbox_count = 0
        self._background: set[asyncio.Task[None]] = set()  # teardowns after lean runs
        # Lean runs in flight, and the episode runs closed here, by workflow run
        # id: the episode's teardown stops its lean run (or bars one that starts
        # late), so a kill that lands while the sandbox is still being made
        # leaves nothing behind.
        self._lean_runs: dict[str, asyncio.Task[RunScriptedResult]] = {}
        self._closed_runs: OrderedDict[str, None] = OrderedDict()
        self._provisions: dict[str, asyncio.Task[Any]] = {}  # run id -> provision in flight

    # ------------------------------------------------------------ lifecycle
    @activity.defn(name="corral.provision")
    async def provision(self, input: ProvisionInput) -> ProvisionResult:
        """The episode's sandbox: found again on a retry, warm if the pool has one,
        else made cold under the id derived from the workflow id.

        Registered under its workflow run id while it lasts, as a lean run is: a
        cancel that lands while the sandbox is being made runs the episode's
        teardown at once, and that teardown waits for this to finish before it
        looks for the sandbox, so nothing is made after the teardown looked.
        """
        run_id = _workflow_run_id()
        if not run_id:  # called outside an activity (tests, bench)
            return await self._provision(input)
        if run_id in self._closed_runs:
            raise _app_error_from_message(
                "EpisodeClosed", "episode closed before its sandbox was made"
            )
        current = asyncio.current_task()
        if current is not None:
            self._provisions[run_id] = current
        try:
            return await self._provision(input)
        finally:
            if self._provisions.get(run_id) is current:
                del self._provisions[run_id]

    async def _provision(self, input: ProvisionInput) -> ProvisionResult:
        started = time.monotonic()
        spec = sandbox_spec_for(input.spec, input.labels)
        workflow_id = input.labels.get(OWNER_LABEL, "")
        existing = None
        if not _first_attempt():  # only an earlier attempt can have left one
            existing = await self._owned_sandbox(input.sandbox_id, workflow_id)
        attrs = {
            "corral.image": spec.image,
            NODE_LABEL: self.node,
            OWNER_LABEL: workflow_id,
        }
        source: ProvisionSource = "existing"
        with span("corral.provision", **attrs) as current:
            sandbox_id = existing
            if sandbox_id is None and self._pool and input.spec.network.mode == "none":
                sandbox_id, source = await self._pool.acquire(spec, input.labels), "warm"
            if sandbox_id is None:
                sandbox_id, source = input.sandbox_id, "cold"
                if self._fetch_image is not None:
                    await _heartbeating(_mapped(self._fetch_image(spec.image)))
                # a registry image this node lacks is pulled now, once for all its episodes
                pull = self._containerd.pulls.ensure(spec.image, self._registry)
                await _heartbeating(_mapped(pull))
                await self._reserve(sandbox_id, spec.cpu_cores)
                try:
                    await _heartbeating(
                        _mapped(self._containerd.create_sandbox(sandbox_id, spec, input.labels))
                    )
                except BaseException:
                    (await self._ledger()).pop(sandbox_id, None)
                    raise
            (await self._ledger())[sandbox_id] = spec.cpu_cores
            await self._open_gateway(sandbox_id, input.spec)
            await self._start_services(sandbox_id, input)
            current.set_attribute(ATTR_SANDBOX_ID, sandbox_id)
            current.set_attribute("corral.provision.source", source)
        seconds = time.monotonic() - started
        if existing is None:
            self._sandbox_count += 1
            if self._metrics:
                self._metrics.record_provision(seconds, self.node, spec.image)
                self._metrics.sandbox_added(self.node, sandbox_id)
        return ProvisionResult(
            sandbox_id=sandbox_id,
            node=self.node,
            provision_s=seconds,
            created=existing is None,
            source=source,
        )

    async def _open_gateway(self, sandbox_id: str, spec: EpisodeSpec) -> None:
        """The model gateway on the sandbox's loopback, when its episode asks."""
        if spec.model_gateway is None:
            return
        if self._gateway is None:
            raise _app_error_from_message(
                "InvalidSpec",
                f"model_gateway: node {self.node} runs no gateway",
            )
        sandbox = await _mapped(self._containerd.get_sandbox(sandbox_id))
        pid = await _mapped(sandbox.pid())
        key = spec.env.get(API_KEY_ENV, "")
        await _mapped(self._gateway.open(sandbox_id, pid, spec.model_gateway, key))

    async def _start_services(self, sandbox_id: str, input: ProvisionInput) -> None:
        """The spec's services beside the sandbox, ready (activities/services.py)."""
        if not input.spec.services:
            return
        agent = await _mapped(self._containerd.get_sandbox(sandbox_id))
        pull = self._containerd.pulls.ensure

        async def ensure_image(image: str) -> object:
            return await _heartbeating(pull(image, self._registry))

        started = start_services(
            self._containerd, agent, input.spec, input.labels, ensure_image=ensure_image
        )
        made = await _heartbeating(_mapped(started))
        ledger = await self._ledger()
        for service, made_id in zip(input.spec.services, made, strict=True):
            ledger[made_id] = service.cpu_cores

    def _model_calls(self, sandbox_id: str) -> list[ModelCall]:
        return self._gateway.drain(sandbox_id) if self._gateway else []

    async def use(self) -> NodeUsage:
        """What this node uses now and whether it admits more (heartbeats carry it)."""
        ledger = await self._ledger()
        usage = measure(ledger, self._cpu.busy_ids(), self._state_dir, self._sandbox_cpu.cores())
        return self._gate.judge(usage)

    async def _ledger(self) -> dict[str, float]:
        """Live sandboxes -> CPU ceiling, read from containerd once per worker."""
        if self._ceilings is None:
            live = await _mapped(self._containerd.list_sandboxes())
            self._ceilings = {info.id: ceiling_cores(info.id) or 0.0 for info in live}
        return self._ceilings

    async def _reserve(self, sandbox_id: str, cpu_cores: float) -> None:
        """Take room for a new sandbox, or raise NodeFull naming the used-up budget."""
        full = room_for(self.capacity, await self.use(), self._gate.hard_limits())
        if full:
            raise _app_error_from_message("NodeFull", f"node {self.node} is full: {full}")
        (await self._ledger())[sandbox_id] = cpu_cores

    async def _resolve(self, sandbox_id: str, workflow_id: str) -> str:
        """The episode's sandbox: by id, else (warm claim) by its workflow label."""
        if not workflow_id:
            return sandbox_id
        return await self._owned_sandbox(sandbox_id, workflow_id) or sandbox_id

    async def _owned_sandbox(self, derived_id: str, workflow_id: str) -> str | None:
        """The sandbox an earlier attempt of this provision made or claimed, if any."""
        if await self._exists(derived_id):
            return derived_id
        if self._pool is None or not workflow_id:
            return None
        owned = await self._containerd.list_sandboxes({OWNER_LABEL: workflow_id})
        agents = [info.id for info in owned if SERVICE_OF_LABEL not in info.labels]
        return agents[0] if agents else None

    @activity.defn(name="corral.teardown")
    async def teardown(self, input: TeardownInput) -> TeardownResult:
        started = time.monotonic()
        if input.run_id:
            self._close_run(input.run_id)
            await self._stop_lean_run(input.run_id)
            await self._await_provision(input.run_id)
        input.sandbox_id = await self._resolve(input.sandbox_id, input.workflow_id)
        # Alerts still on their way decide the outcome: the episode reads them
        # after this returns (a background job may have acted after the last step).
        verdict = (
            await self.settle(input.sandbox_id) if input.workflow_id else Verdict(status="off")
        )
        model_calls = self._model_calls(input.sandbox_id)
        if self._gateway is not None:
            await self._gateway.close(input.sandbox_id)
        for service in await _mapped(stop_services(self._containerd, input.sandbox_id)):
            (await self._ledger()).pop(service, None)
        with span("corral.teardown", **{ATTR_SANDBOX_ID: input.sandbox_id, ATTR_NODE: self.node}):
            removed = await _heartbeating(
                _mapped(self._containerd.destroy_sandbox(input.sandbox_id))
            )
        shutil.rmtree(self._journal_dir(input.sandbox_id), ignore_errors=True)
        for image in input.drop_images:
            await _mapped(self._drop_image(image))
        (await self._ledger()).pop(input.sandbox_id, None)
        seconds = time.monotonic() - started
        if removed:
            self._sandbox_count = max(0, self._sandbox_count - 1)
            if self._metrics:
                self._metrics.record_teardown(seconds, self.node, "")
                self._metrics.sandbox_removed(self.node, input.sandbox_id)
        if input.record is not None:
            input.record.result.teardown_s = seconds
            self._record(input.record)
        return TeardownResult(
            sandbox_id=input.sandbox_id,
            removed=removed,
            teardown_s=seconds,
            sensor=verdict.status,
            model_calls=model_calls,
        )

    async def _drop_image(self, image: str) -> None:
        with contextlib.suppress(ImageNotFound):  # a retried teardown removed it already
            await self._containerd.images.remove(image)

    @activity.defn(name="corral.freeze")
    async def freeze(self, input: SandboxRef) -> None:
        """Quarantine: stop every process and cut the network; keep the filesystem."""
        sandbox_id = await self._resolve(input.sandbox_id, input.workflow_id)
        sandbox = await _mapped(self._containerd.get_sandbox(sandbox_id))
        await _mapped(sandbox.cut_network())  # False when it has no network to cut
        if await sandbox.status() != "paused":
            try:
                await sandbox.pause()
            except CorralError as err:
                # The node's sensor may have frozen it in place meanwhile.
                if await sandbox.status() != "paused":
                    raise _to_app_error(err) from err
        if self._metrics:
            self._metrics.sandbox_moved(self.node, sandbox_id, "paused")

    @activity.defn(name="corral.thaw")
    async def thaw(self, input: SandboxRef) -> None:
        sandbox_id = await self._resolve(input.sandbox_id, input.workflow_id)
        sandbox = await _mapped(self._containerd.get_sandbox(sandbox_id))
        if await sandbox.status() == "paused":
            await _mapped(sandbox.resume())
        await _mapped(sandbox.restore_network())
        if self._metrics:
            self._metrics.sandbox_moved(self.node, sandbox_id, "running")

    # ----------------------------------------------------------------- steps
    @activity.defn(name="corral.exec_step")
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
            result = await self._run_step(input)
        verdict = await self.settle(input.sandbox_id, gaps)
        self._verdicts[input.sandbox_id] = verdict
        result.sensor, result.settle_ms = verdict.status, verdict.waited_ms
        result.model_calls = self._model_calls(input.sandbox_id)
        _atomic_write(done, result.model_dump_json())
        return result

    def _last_verdict(self, sandbox_id: str) -> Verdict:
        return self._verdicts.pop(sandbox_id, None) or Verdict(status="off")

    async def _sensor_required(self) -> int | None:
        """The sensor's gap count, or SensorDown (retried) when it is not watching."""
        if self._sensor is None:
            return None
        return await _heartbeating(_mapped(self._sensor.require()))

    async def settle(self, sandbox_id: str, gaps: int | None = None) -> Verdict:
        """Until the sensor has judged the sandbox's events so far (bounded)."""
        if self._sensor is None:
            return Verdict(status="off")
        return await _heartbeating(self._sensor.settle(sandbox_id, gaps))

    @activity.defn(name="corral.run_scripted")
    async def run_scripted(self, input: RunScriptedInput) -> RunScriptedResult:
        """The lean path of a scripted episode: one activity, one round trip.

        Each step is journaled as in `exec_step`, so a retry after a crash
        answers finished steps from the journal and reattaches a running one.
        A quarantine freezes the sandbox between or during steps; the next
        step waits for the thaw. The sandbox is destroyed after the result is
        returned; if this worker dies first, the janitor reaps it.

        The run is registered under its workflow run id while it lasts: the
        episode's teardown (a kill, a cancel) stops it before destroying the
        sandbox, and a later attempt replaces an earlier one the server gave up on.
        """
        run_id = _workflow_run_id()
        if not run_id:  # called outside an activity (tests, bench)
            return await self._run_scripted(input)
        await self._stop_lean_run(run_id)
        if run_id in self._closed_runs:
            raise _app_error_from_message(
                "EpisodeClosed", "episode closed before its lean run started"
            )
        run = asyncio.create_task(self._run_scripted(input))
        self._lean_runs[run_id] = run
        try:
            return await run
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # the activity itself was cancelled
            raise _app_error_from_message(
                "EpisodeClosed", "lean run stopped: its episode closed"
            ) from None
        finally:
            if self._lean_runs.get(run_id) is run:
                del self._lean_runs[run_id]

    async def _stop_lean_run(self, run_id: str) -> None:
        """Stop this run's lean activity, if one is in flight here, and wait for it."""
        run = self._lean_runs.get(run_id)
        if run is None or run.done():
            return
        run.cancel()
        await _heartbeating(asyncio.wait({run}, timeout=LEAN_STOP_WAIT_S))

    async def _await_provision(self, run_id: str) -> None:
        """Let this run's provision, if one is in flight here, finish (or roll
        back) first: the teardown then finds what it made."""
        provision = self._provisions.get(run_id)
        if provision is not None and not provision.done():
            await _heartbeating(asyncio.wait({provision}, timeout=LEAN_STOP_WAIT_S))

    def _close_run(self, run_id: str) -> None:
        self._closed_runs[run_id] = None
        while len(self._closed_runs) > CLOSED_RUNS_KEPT:
            self._closed_runs.popitem(last=False)

    async def _run_scripted(self, input: RunScriptedInput) -> RunScriptedResult:
        provision = await _uncut(self.provision(input.provision))
        sandbox_id = provision.sandbox_id
        for request in input.files:
            await self.write_file(WriteFileInput(sandbox_id=sandbox_id, request=request))
        steps: list[StepResult] = []
        index = input.first_index
        for step in input.steps:
            result = await self._lean_step(input, sandbox_id, step, index, "scripted")
            index += 1
            if result.interrupted and input.idempotent_steps:
                steps.append(result)
                result = await self._lean_step(input, sandbox_id, step, index, "scripted")
                index += 1
            steps.append(result)
            if not result.ok:
                break
        reward = None
        if input.reward is not None and all(step.ok for step in steps[-1:]):
            reward = await self._lean_step(input, sandbox_id, input.reward, index, "reward")
        if self._last_verdict(sandbox_id).stops_episode:
            # An alert will kill or quarantine the episode: its sandbox stays
            # (frozen) for the episode's own freeze and teardown.
            return RunScriptedResult(
                provision=provision, steps=steps, reward=reward, torn_down=False
            )
        self._destroy_soon(sandbox_id)
        return RunScriptedResult(provision=provision, steps=steps, reward=reward)

    async def _lean_step(
        self, input: RunScriptedInput, sandbox_id: str, step: Step, index: int, source: str
    ) -> StepResult:
        await self._until_thawed(sandbox_id)
        return await self.exec_step(
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
        sandbox = await _mapped(self._containerd.get_sandbox(sandbox_id))
        while await sandbox.status() == "paused":
            with contextlib.suppress(RuntimeError):
                activity.heartbeat("quarantined")
            await asyncio.sleep(0.2)

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
                await self.teardown(TeardownInput(sandbox_id=sandbox_id))
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

    async def _run_step(self, input: ExecStepInput) -> StepResult:
        step = input.step
        sandbox = await _mapped(self._containerd.get_sandbox(input.sandbox_id))
        started_at = datetime.now(UTC)
        attrs = {ATTR_SANDBOX_ID: input.sandbox_id, ATTR_NODE: self.node}
        with span("corral.exec", **attrs), self._working(sandbox.id, sandbox.labels):
            # Durable: a fixed exec id and output in files, so that a worker
            # restarted mid-step reattaches to it (_reattach) instead of losing it.
            raw = await _heartbeating(
                _mapped(
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
            sandbox = await self._containerd.get_sandbox(input.sandbox_id)
            raw = await _heartbeating(
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
            if type(err).__name__ in ("ContainerdUnavailable", "ContainerdError"):
                raise _to_app_error(err) from err  # retried: containerd may come back
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

    @contextlib.contextmanager
    def _working(self, sandbox_id: str, labels: dict[str, str]) -> Iterator[None]:
        """A step or file operation: full CPU weight, and background work waits."""
        with self._cpu.busy(sandbox_id, labels), self._foreground.held():
            yield

    def _step_output_dir(self, input: ExecStepInput) -> Path:
        return self._journal_dir(input.sandbox_id) / f"{input.index}.out"

    # ----------------------------------------------------------------- files
    @activity.defn(name="corral.write_file")
    async def write_file(self, input: WriteFileInput) -> None:
        sandbox = await _mapped(self._containerd.get_sandbox(input.sandbox_id))
        data = base64.b64decode(input.request.content_b64)
        with self._working(sandbox.id, sandbox.labels):
            await _heartbeating(
                _mapped(sandbox.write_file(input.request.path, data, input.request.mode))
            )

    @activity.defn(name="corral.read_file")
    async def read_file(self, input: ReadFileInput) -> FileContent:
        sandbox = await _mapped(self._containerd.get_sandbox(input.sandbox_id))
        with self._working(sandbox.id, sandbox.labels):
            data = await _heartbeating(
                _mapped(sandbox.read_file(input.request.path, input.request.max_bytes))
            )
        return FileContent(
            path=input.request.path, content_b64=base64.b64encode(data).decode(), size=len(data)
        )

    # --------------------------------------------------------------- records
    def _record(self, input: RecordEpisodeInput) -> None:
        record_episode(input, self._records, self._metrics)

    # --------------------------------------------------------------- janitor
    @activity.defn(name="corral.reap_orphans")
    async def reap_orphans(self, input: ReapInput) -> ReapResult:
        """Remove sandboxes whose workflow is closed or unknown (terminated, lost),
        the rootfs snapshots of creates a crash cut off before their container,
        and the scratch of an image remap a crash cut off."""
        if self._temporal is None:
            raise ApplicationError("node worker has no Temporal client", non_retryable=True)
        sandboxes = await _mapped(self._containerd.list_sandboxes({"corral.sandbox": "1"}))
        removed: list[str] = []
        now = datetime.now(UTC)
        for info in sandboxes:
            with contextlib.suppress(RuntimeError):  # also run by the node worker at start
                activity.heartbeat(info.id)
            workflow_id = info.labels.get(OWNER_LABEL)
            created = _as_utc(info.created_at)
            young = created is not None and (now - created).total_seconds() < input.grace_s
            if not workflow_id or young or await self._workflow_open(workflow_id):
                continue
            await self.teardown(TeardownInput(sandbox_id=info.id))
            removed.append(info.id)
        known = {info.id for info in sandboxes}
        for key in await _mapped(self._containerd.orphan_snapshots(known, input.grace_s)):
            await self.teardown(TeardownInput(sandbox_id=key))
            removed.append(key)
        removed += await _mapped(self._containerd.clear_stale_remaps(input.grace_s))
        return ReapResult(node=self.node, checked=len(sandboxes), removed=removed)

    async def _workflow_open(self, workflow_id: str) -> bool:
        assert self._temporal is not None
        try:
            desc = await self._temporal.get_workflow_handle(workflow_id).describe()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return False
            raise
        return desc.status is not None and desc.status.name == "RUNNING"

    # --------------------------------------------------------------- helpers
    def _journal_dir(self, sandbox_id: str) -> Path:
        return self._state_dir / "journal" / sandbox_id

    async def _exists(self, sandbox_id: str) -> bool:
        try:
            await self._containerd.get_sandbox(sandbox_id)
        except SandboxNotFound:
            return False
        return True

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


def record_episode(
    input: RecordEpisodeInput, records: RecordWriter | None, metrics: Metrics | None
) -> None:
    """Hand the result to the buffered Parquet writer (never slows the episode)
    and count its outcome and alerts."""
    if metrics:
        metrics.record_episode(input.result.outcome)
        for alert in input.result.alerts:
            metrics.record_alert(alert.rule, alert.action)
    if records is None:
        return
    for record in episode_records(input):
        records.append(record)


def episode_records(input: RecordEpisodeInput) -> list[Any]:
    """An episode result as the analysis store's episode, step and alert rows."""
    result = input.result
    started = result.started_at or datetime.now(UTC)
    ended = result.ended_at or started
    rows: list[Any] = [
        EpisodeRecord(
            workflow_id=input.workflow_id,
            run_id=input.run_id,
            tenant=result.tenant,
            image=result.image,
            node=result.node,
            started_at=started,
            ended_at=ended,
            duration_s=result.duration_s,
            outcome=result.outcome,
            reason=result.reason or None,
            reward=_reward_value(result.reward),
            steps=len(result.steps),
            provision_s=result.provision_s,
            teardown_s=result.teardown_s,
            alerts=[
                EpisodeAlert(
                    rule=a.rule, priority=a.priority, action=a.action, time=a.time or ended
                )
                for a in result.alerts
            ],
        )
    ]
    rows += [
        StepRecord(
            workflow_id=input.workflow_id,
            index=s.index,
            command=s.cmd,
            exit_code=s.exit_code,
            duration_s=s.duration_s,
            timed_out=s.timed_out,
            started_at=s.started_at or started,
        )
        for s in result.steps
    ]
    rows += [
        AlertRecord(
            workflow_id=input.workflow_id,
            rule=a.rule,
            priority=a.priority,
            action=a.action,
            time=a.time or ended,
            image=result.image,
            node=result.node,
        )
        for a in result.alerts
    ]
    return rows


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


def _reward_value(reward: StepResult | None) -> float | None:
    """The reward command's last output line, when it is a number."""
    if reward is None or not reward.stdout.strip():
        return None
    try:
        return float(reward.stdout.strip().splitlines()[-1])
    except ValueError:
        return None


async def _heartbeating(work: Awaitable[T]) -> T:
    """Await `work` while heartbeating, so a dead worker is noticed in seconds."""
    task = asyncio.ensure_future(work)
    while True:
        done, _ = await asyncio.wait({task}, timeout=HEARTBEAT_EVERY_S)
        if done:
            return task.result()
        with contextlib.suppress(RuntimeError):  # outside an activity (tests, bench)
            activity.heartbeat()


async def _uncut(work: Awaitable[T]) -> T:
    """Run `work` to its end even if the caller is cancelled meanwhile, then
    re-raise the cancellation. containerd goes on making a sandbox whose call
    was cut off; the teardown that stopped the caller must find all of it."""
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait({task})
        if not task.cancelled():
            task.exception()  # retrieved: its failure matters no more
        raise


async def _mapped(work: Awaitable[T]) -> T:
    try:
        return await work
    except CorralError as err:
        raise _to_app_error(err) from err


def _to_app_error(err: CorralError) -> ApplicationError:
    # containerd down or restarting, or a start that failed and was rolled back
    # (runc under memory pressure, a shim that did not come up): a retry can help.
    # A node whose sensor is down: the command waits for it (retries), never runs unwatched.
    retryable = isinstance(err, SensorDown) or (
        isinstance(err, SandboxError)
        and type(err).__name__ in ("ContainerdUnavailable", "ContainerdError", "SandboxStartFailed")
    )
    return ApplicationError(str(err), type=type(err).__name__, non_retryable=not retryable)


def _first_attempt() -> bool:
    """True in an activity's first attempt; False outside an activity (unknown)."""
    try:
        return activity.info().attempt == 1
    except RuntimeError:
        return False


def _workflow_run_id() -> str:
    """The calling episode's run id, or "" outside an activity."""
    try:
        return activity.info().workflow_run_id or ""
    except RuntimeError:
        return ""


def _app_error_from_message(error_type: str, message: str) -> ApplicationError:
    return ApplicationError(message, type=error_type, non_retryable=True)


def _as_utc(moment: datetime | None) -> datetime | None:
    """containerd's timestamps arrive naive (protobuf `ToDatetime`) but are UTC."""
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
