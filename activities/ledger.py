"""What this node's sandboxes hold of its budget, and the CPU weight of the busy ones.

The ledger maps each live sandbox (services included) to its nominal CPU
ceiling: read from containerd once per worker, then kept in step by the
provisions and teardowns. A provision reserves against it (`reserve`:
`NodeFull` names the used-up budget); heartbeats report `use()`, measured,
judged with hysteresis by `AdmissionGate` (activities/capacity.py). While a
step or a file operation runs, its sandbox has its full CPU weight and the
node's background work waits (`working`, activities/foreground.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from activities.capacity import AdmissionGate, SandboxCpuMeter, measure, room_for
from activities.foreground import Foreground
from activities.glue import app_error, mapped
from contract.models import NodeCapacity, NodeUsage
from sandbox.cgroups import ElasticCpu, ceiling_cores
from sandbox.runtime import SandboxRuntime


class NodeLedger:
    def __init__(
        self,
        node: str,
        runtime: SandboxRuntime,
        capacity: NodeCapacity,
        state_dir: Path,
        foreground: Foreground,
    ) -> None:
        self.node = node
        self.capacity = capacity
        # Steps hold it; background teardowns and pool refills wait for it.
        self.foreground = foreground
        self._runtime = runtime
        self._state_dir = state_dir
        # Measured limits with hysteresis: heartbeats and provisions judge alike.
        self._gate = AdmissionGate(capacity)
        self._sandbox_cpu = SandboxCpuMeter()
        self._cpu = ElasticCpu()
        # This node's episode sandboxes and their CPU ceilings (the nominal CPU
        # committed); filled from containerd on first use, then kept in step.
        self._ceilings: dict[str, float] | None = None

    async def use(self) -> NodeUsage:
        """What this node uses now and whether it admits more (heartbeats carry it)."""
        ledger = await self._ledger()
        usage = measure(ledger, self._cpu.busy_ids(), self._state_dir, self._sandbox_cpu.cores())
        return self._gate.judge(usage)

    async def reserve(self, sandbox_id: str, cpu_cores: float) -> None:
        """Take room for a new sandbox, or raise NodeFull naming the used-up budget."""
        full = room_for(self.capacity, await self.use(), self._gate.hard_limits())
        if full:
            raise app_error("NodeFull", f"node {self.node} is full: {full}")
        (await self._ledger())[sandbox_id] = cpu_cores

    async def hold(self, sandbox_id: str, cpu_cores: float) -> None:
        """`sandbox_id` is live here with this CPU ceiling (made, claimed or found)."""
        (await self._ledger())[sandbox_id] = cpu_cores

    async def release(self, sandbox_id: str) -> None:
        (await self._ledger()).pop(sandbox_id, None)

    @contextlib.contextmanager
    def working(self, sandbox_id: str, labels: dict[str, str]) -> Iterator[None]:
        """A step or file operation: full CPU weight, and background work waits."""
        with self._cpu.busy(sandbox_id, labels), self.foreground.held():
            yield

    async def _ledger(self) -> dict[str, float]:
        """Live sandboxes -> CPU ceiling, read from containerd once per worker."""
        if self._ceilings is None:
            live = await mapped(self._runtime.list_sandboxes())
            self._ceilings = {info.id: ceiling_cores(info.id) or 0.0 for info in live}
        return self._ceilings
