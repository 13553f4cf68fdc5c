"""Quarantine on the node: `corral.freeze` and `corral.thaw`.

A frozen sandbox has every process stopped and its network cut; its
filesystem stays for on-call to look at. The node's sensor may have frozen
it in place already (a kill or quarantine enforced on the node), so a
freeze of a paused sandbox is no error. Thawing resumes it and restores
its network.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from activities.glue import mapped, to_app_error
from contract.errors import CorralError
from contract.models import SandboxRef
from observability.metrics import Metrics
from sandbox.runtime import SandboxRuntime

# The episode's sandbox by id, else by its owner label (a warm claim keeps its id).
Resolve = Callable[[str, str], Awaitable[str]]


class Quarantine:
    def __init__(
        self, node: str, runtime: SandboxRuntime, resolve: Resolve, metrics: Metrics | None
    ) -> None:
        self.node = node
        self._runtime = runtime
        self._resolve = resolve
        self._metrics = metrics

    async def freeze(self, input: SandboxRef) -> None:
        """Quarantine: stop every process and cut the network; keep the filesystem."""
        sandbox_id = await self._resolve(input.sandbox_id, input.workflow_id)
        sandbox = await mapped(self._runtime.get_sandbox(sandbox_id))
        await mapped(sandbox.cut_network())  # False when it has no network to cut
        if await sandbox.status() != "paused":
            try:
                await sandbox.pause()
            except CorralError as err:
                # The node's sensor may have frozen it in place meanwhile.
                if await sandbox.status() != "paused":
                    raise to_app_error(err) from err
        if self._metrics:
            self._metrics.sandbox_moved(self.node, sandbox_id, "paused")

    async def thaw(self, input: SandboxRef) -> None:
        sandbox_id = await self._resolve(input.sandbox_id, input.workflow_id)
        sandbox = await mapped(self._runtime.get_sandbox(sandbox_id))
        if await sandbox.status() == "paused":
            await mapped(sandbox.resume())
        await mapped(sandbox.restore_network())
        if self._metrics:
            self._metrics.sandbox_moved(self.node, sandbox_id, "running")
