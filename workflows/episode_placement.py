"""Where the episode's sandbox runs: placement from the node registry (waiting,
visibly, while no node has room), placing again when a node is lost or full,
and the step-by-step path's provision (the sandbox, then the spec's files).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.node import NodeActivities
    from contract.labels import (
        NODE_LABEL,
        OWNER_LABEL,
        RUN_ID_LABEL,
        TENANT_LABEL,
        USER_LABEL_PREFIX,
    )
    from contract.models import PlaceInput, Placement, ProvisionInput, WriteFileInput
    from workflows.episode_support import (
        NODE_FULL_WAITS,
        PLACE_RETRY_S,
        PROVISION_ATTEMPTS,
        Killed,
        file_request,
        settle,
    )
    from workflows.episode_view import EpisodeView
    from workflows.steps import application_cause


class EpisodePlacement(EpisodeView):
    async def _provision_watched(self) -> None:
        """Provision while watching for a kill or the loss of the node.

        A node lost before the sandbox is up costs nothing but time: the
        episode is placed again elsewhere (its leftovers are reaped when the
        node comes back). A node that turns out full is skipped the same way.
        """
        while True:
            self._lost_node = ""
            task = asyncio.create_task(self._provision())
            await workflow.wait_condition(
                lambda: task.done() or self._s.kill is not None or bool(self._lost_node),  # noqa: B023 - awaited here
            )
            if not task.done():
                task.cancel()
                await settle(task)
                if self._s.kill is not None:
                    raise Killed(self._s.kill)
                self._replace(self._lost_node)
                continue
            try:
                task.result()
                return
            except ActivityError as err:
                cause = application_cause(err)
                if cause is None or cause.type != "NodeFull" or self._input.node:
                    raise
                if workflow.patched(NODE_FULL_WAITS):
                    # Full now is not full for ever (a one-node fleet would
                    # exclude its only node): wait, then place again.
                    self._wait_for(f"{self._s.node} is full: {cause.message}")
                    self._s.node = ""
                    await workflow.sleep(PLACE_RETRY_S)
                    continue
                self._replace(self._s.node)

    def _replace(self, node: str) -> None:
        """Forget a node that cannot take this episode; placement picks another."""
        workflow.logger.info("placing %s again: %s cannot take it", self._s.sandbox_id, node)
        self._avoid.append(node)
        self._s.node = ""

    async def _provision(self) -> None:
        if not self._s.node:
            self._s.node = await self._place()
        self._set_state("provisioning")
        result = await self._node_activity(
            NodeActivities.provision,
            ProvisionInput(sandbox_id=self._s.sandbox_id, spec=self._spec, labels=self._labels()),
            timeout_s=300,
            attempts=PROVISION_ATTEMPTS,
        )
        self._s.provision_s = result.provision_s
        # A warm sandbox keeps its own id; every later activity uses the real one.
        self._s.sandbox_id = result.sandbox_id
        for spec_file in self._spec.files:
            await self._node_activity(
                NodeActivities.write_file,
                WriteFileInput(sandbox_id=self._s.sandbox_id, request=file_request(spec_file)),
                timeout_s=60,
            )
        self._s.ready = True

    def _labels(self) -> dict[str, str]:
        info = workflow.info()
        return {
            OWNER_LABEL: info.workflow_id,
            RUN_ID_LABEL: info.run_id,
            TENANT_LABEL: self._spec.tenant,
            NODE_LABEL: self._s.node,
            **{f"{USER_LABEL_PREFIX}{k}": v for k, v in self._spec.labels.items()},
        }

    def _wait_for(self, reason: str) -> None:
        """Show why the episode waits (quota, room) in the Web UI and visibility."""
        if self._s.state != "waiting" or self._s.reason != reason:
            self._s.reason = reason
            self._set_state("waiting")

    async def _place(self, image: str = "") -> str:
        """A node from the registry (a local activity: no node is asked); while
        none has room the episode waits, visibly, and asks again."""
        resources = self._spec.resources
        request = PlaceInput(
            image=image or self._spec.image,
            cpu_cores=resources.cpu_cores,
            memory_mb=resources.memory_mb,
            pids=resources.pids_limit,
            exclude=self._avoid,
        )
        while True:
            placement: Placement = await workflow.execute_local_activity(
                "corral.place",
                request,
                result_type=Placement,
                start_to_close_timeout=timedelta(seconds=5),
            )
            self._s.queue_position = placement.position
            if placement.node is not None:
                return placement.node
            self._wait_for(placement.reason)
            await workflow.sleep(PLACE_RETRY_S)
