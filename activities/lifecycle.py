"""An episode's sandbox made and torn down: `corral.provision` and `corral.teardown`.

Provisioning is idempotent by sandbox id (sha256 of the workflow id): a retry
finds the sandbox an earlier attempt made, or the warm one it claimed (by its
owner label). Otherwise the sandbox is claimed warm from the pool, or made
cold after the image is brought here (a sibling's snapshot, a registry pull)
and room reserved in the node's ledger; then the model gateway is opened on
its loopback and the spec's services started beside it. The teardown stops
the episode's run on the node first (activities/episode_runs.py), waits for
the sensor's verdict, and removes the services, the sandbox, its journal and
the images the episode asked to drop; it writes the episode's records.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable

from activities.episode_runs import EpisodeRuns
from activities.gateway import NodeGateway
from activities.glue import app_error, first_attempt, heartbeating, mapped, workflow_run_id
from activities.ledger import NodeLedger
from activities.pool import WarmPool
from activities.records import record_episode
from activities.sensorwatch import Verdict
from activities.services import start_services, stop_services
from activities.step_exec import StepRunner
from contract.errors import ImageNotFound, SandboxNotFound
from contract.labels import CPU_MODE_LABEL, NODE_LABEL, OWNER_LABEL, SERVICE_OF_LABEL
from contract.models import (
    API_KEY_ENV,
    EpisodeSpec,
    ProvisionInput,
    ProvisionResult,
    ProvisionSource,
    TeardownInput,
    TeardownResult,
)
from observability.metrics import Metrics
from observability.records import RecordWriter
from observability.tracing import ATTR_NODE, ATTR_SANDBOX_ID, span
from sandbox import SandboxSpec, network
from sandbox.cgroups import IDLE_SHARES, busy_shares
from sandbox.registry import RegistryOptions
from sandbox.runtime import SandboxRuntime
from sandbox.userns import range_for_tenant


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
        raise app_error("InvalidSpec", f"invalid episode spec: {err}") from err


class Lifecycle:
    def __init__(
        self,
        node: str,
        runtime: SandboxRuntime,
        ledger: NodeLedger,
        runs: EpisodeRuns,
        steps: StepRunner,
        *,
        pool: WarmPool | None = None,
        registry: RegistryOptions | None = None,
        fetch_image: Callable[[str], Awaitable[bool]] | None = None,
        gateway: NodeGateway | None = None,
        metrics: Metrics | None = None,
        records: RecordWriter | None = None,
    ) -> None:
        self.node = node
        self._runtime = runtime
        self._ledger = ledger
        self._runs = runs
        self._steps = steps
        self._pool = pool
        self._registry = registry or RegistryOptions()
        # Brings a snapshot made on a sibling node here (activities/snapshots.py).
        self._fetch_image = fetch_image
        # The model gateway on the loopback of sandboxes that ask for it.
        self._gateway = gateway
        self._metrics = metrics
        self._records = records

    # ------------------------------------------------------------ provision
    async def provision(self, input: ProvisionInput) -> ProvisionResult:
        """The episode's sandbox: found again on a retry, warm if the pool has one,
        else made cold under the id derived from the workflow id.

        Registered under its workflow run id while it lasts, as a lean run is: a
        cancel that lands while the sandbox is being made runs the episode's
        teardown at once, and that teardown waits for this to finish before it
        looks for the sandbox, so nothing is made after the teardown looked.
        """
        run_id = workflow_run_id()
        if not run_id:  # called outside an activity (tests, bench)
            return await self._provision(input)
        with self._runs.provisioning(run_id):
            return await self._provision(input)

    async def _provision(self, input: ProvisionInput) -> ProvisionResult:
        started = time.monotonic()
        spec = sandbox_spec_for(input.spec, input.labels)
        workflow_id = input.labels.get(OWNER_LABEL, "")
        existing = None
        if not first_attempt():  # only an earlier attempt can have left one
            existing = await self._owned_sandbox(input.sandbox_id, workflow_id)
        attrs = {"corral.image": spec.image, NODE_LABEL: self.node, OWNER_LABEL: workflow_id}
        source: ProvisionSource = "existing"
        with span("corral.provision", **attrs) as current:
            sandbox_id = existing
            if sandbox_id is None and self._pool and input.spec.network.mode == "none":
                sandbox_id, source = await self._pool.acquire(spec, input.labels), "warm"
            if sandbox_id is None:
                sandbox_id, source = input.sandbox_id, "cold"
                await self._make(sandbox_id, spec, input.labels)
            await self._ledger.hold(sandbox_id, spec.cpu_cores)
            await self._open_gateway(sandbox_id, input.spec)
            await self._start_services(sandbox_id, input)
            current.set_attribute(ATTR_SANDBOX_ID, sandbox_id)
            current.set_attribute("corral.provision.source", source)
        seconds = time.monotonic() - started
        if existing is None and self._metrics:
            self._metrics.record_provision(seconds, self.node, spec.image)
            self._metrics.sandbox_added(self.node, sandbox_id)
        return ProvisionResult(
            sandbox_id=sandbox_id,
            node=self.node,
            provision_s=seconds,
            created=existing is None,
            source=source,
        )

    async def _make(self, sandbox_id: str, spec: SandboxSpec, labels: dict[str, str]) -> None:
        """A cold sandbox: its image brought here, room reserved, then made."""
        if self._fetch_image is not None:
            await heartbeating(mapped(self._fetch_image(spec.image)))
        # a registry image this node lacks is pulled now, once for all its episodes
        await heartbeating(mapped(self._runtime.pulls.ensure(spec.image, self._registry)))
        await self._ledger.reserve(sandbox_id, spec.cpu_cores)
        try:
            await heartbeating(mapped(self._runtime.create_sandbox(sandbox_id, spec, labels)))
        except BaseException:
            await self._ledger.release(sandbox_id)
            raise

    async def _open_gateway(self, sandbox_id: str, spec: EpisodeSpec) -> None:
        """The model gateway on the sandbox's loopback, when its episode asks."""
        if spec.model_gateway is None:
            return
        if self._gateway is None:
            raise app_error("InvalidSpec", f"model_gateway: node {self.node} runs no gateway")
        sandbox = await mapped(self._runtime.get_sandbox(sandbox_id))
        pid = await mapped(sandbox.pid())
        key = spec.env.get(API_KEY_ENV, "")
        await mapped(self._gateway.open(sandbox_id, pid, spec.model_gateway, key))

    async def _start_services(self, sandbox_id: str, input: ProvisionInput) -> None:
        """The spec's services beside the sandbox, ready (activities/services.py)."""
        if not input.spec.services:
            return
        agent = await mapped(self._runtime.get_sandbox(sandbox_id))
        pull = self._runtime.pulls.ensure

        async def ensure_image(image: str) -> object:
            if self._fetch_image is not None:  # a forked service's snapshot, made elsewhere
                await heartbeating(self._fetch_image(image))
            return await heartbeating(pull(image, self._registry))

        started = start_services(
            self._runtime, agent, input.spec, input.labels, ensure_image=ensure_image
        )
        made = await heartbeating(mapped(started))
        for service, made_id in zip(input.spec.services, made, strict=True):
            await self._ledger.hold(made_id, service.cpu_cores)

    # ------------------------------------------------------------- find one
    async def resolve(self, sandbox_id: str, workflow_id: str) -> str:
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
        owned = await self._runtime.list_sandboxes({OWNER_LABEL: workflow_id})
        agents = [info.id for info in owned if SERVICE_OF_LABEL not in info.labels]
        return agents[0] if agents else None

    async def _exists(self, sandbox_id: str) -> bool:
        try:
            await self._runtime.get_sandbox(sandbox_id)
        except SandboxNotFound:
            return False
        return True

    # ------------------------------------------------------------- teardown
    async def teardown(self, input: TeardownInput) -> TeardownResult:
        started = time.monotonic()
        if input.run_id:
            await self._runs.close(input.run_id)
        input.sandbox_id = await self.resolve(input.sandbox_id, input.workflow_id)
        # Alerts still on their way decide the outcome: the episode reads them
        # after this returns (a background job may have acted after the last step).
        verdict = (
            await self._steps.settle(input.sandbox_id)
            if input.workflow_id
            else Verdict(status="off")
        )
        model_calls = self._steps.model_calls(input.sandbox_id)
        if self._gateway is not None:
            await self._gateway.close(input.sandbox_id)
        for service in await mapped(stop_services(self._runtime, input.sandbox_id)):
            await self._ledger.release(service)
        with span("corral.teardown", **{ATTR_SANDBOX_ID: input.sandbox_id, ATTR_NODE: self.node}):
            removed = await heartbeating(mapped(self._runtime.destroy_sandbox(input.sandbox_id)))
        self._steps.forget(input.sandbox_id)
        for image in input.drop_images:
            await mapped(self._drop_image(image))
        await self._ledger.release(input.sandbox_id)
        seconds = time.monotonic() - started
        if removed and self._metrics:
            self._metrics.record_teardown(seconds, self.node, "")
            self._metrics.sandbox_removed(self.node, input.sandbox_id)
        if input.record is not None:
            input.record.result.teardown_s = seconds
            record_episode(input.record, self._records, self._metrics)
        return TeardownResult(
            sandbox_id=input.sandbox_id,
            removed=removed,
            teardown_s=seconds,
            sensor=verdict.status,
            model_calls=model_calls,
        )

    async def _drop_image(self, image: str) -> None:
        with contextlib.suppress(ImageNotFound):  # a retried teardown removed it already
            await self._runtime.images.remove(image)
