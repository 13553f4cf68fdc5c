"""`JanitorWorkflow`: reaps sandboxes whose episode workflow is closed.

Termination runs no workflow code, and a node worker that died mid-teardown
leaves its sandbox behind; a Temporal Schedule starts this workflow every
minute and it asks each node to remove its orphans.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from pydantic import BaseModel, Field
from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.node import NodeActivities
    from workflows.models import ReapInput, ReapResult


class JanitorInput(BaseModel):
    nodes: list[str] = Field(min_length=1)
    node_task_queue_prefix: str = "corral-node-"
    grace_s: float = 30.0


@workflow.defn
class JanitorWorkflow:
    @workflow.run
    async def run(self, input: JanitorInput) -> list[ReapResult]:
        results = await asyncio.gather(
            *(self._reap(input, node) for node in input.nodes), return_exceptions=True
        )
        return [r for r in results if isinstance(r, ReapResult)]

    async def _reap(self, input: JanitorInput, node: str) -> ReapResult:
        return await workflow.execute_activity_method(
            NodeActivities.reap_orphans,
            ReapInput(grace_s=input.grace_s),
            task_queue=f"{input.node_task_queue_prefix}{node}",
            start_to_close_timeout=timedelta(minutes=5),
            heartbeat_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_attempts=2),
        )
