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
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.node import NodeActivities
    from contract.models import ReapInput, ReapResult


class JanitorInput(BaseModel):
    # Empty: every node the registry knows and has not lost (a fleet's nodes
    # come and go; a lost node's leftovers are reaped when it rejoins).
    nodes: list[str] = Field(default_factory=list)
    node_task_queue_prefix: str = "corral-node-"
    grace_s: float = 30.0


@workflow.defn
class JanitorWorkflow:
    @workflow.run
    async def run(self, input: JanitorInput) -> list[ReapResult]:
        nodes = input.nodes or await workflow.execute_local_activity(
            "corral.live_nodes", result_type=list[str], start_to_close_timeout=timedelta(seconds=5)
        )
        results = await asyncio.gather(
            *(self._reap(input, node) for node in nodes), return_exceptions=True
        )
        reaped = [r for r in results if isinstance(r, ReapResult)]
        failed = {
            node: _message(r)
            for node, r in zip(nodes, results, strict=True)
            if not isinstance(r, ReapResult)
        }
        if failed:
            # Every other node was reaped; fail the run so the schedule shows red
            # in the Web UI instead of hiding a node whose orphans pile up.
            raise ApplicationError(
                "reap failed on " + "; ".join(f"{n}: {m}" for n, m in failed.items()),
                [r.model_dump(mode="json") for r in reaped],
                type="JanitorFailed",
                non_retryable=True,
            )
        return reaped

    async def _reap(self, input: JanitorInput, node: str) -> ReapResult:
        return await workflow.execute_activity_method(
            NodeActivities.reap_orphans,
            ReapInput(grace_s=input.grace_s),
            task_queue=f"{input.node_task_queue_prefix}{node}",
            start_to_close_timeout=timedelta(minutes=5),
            heartbeat_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_attempts=2),
        )


def _message(err: BaseException) -> str:
    """The innermost cause's message: what actually went wrong on the node."""
    while getattr(err, "cause", None) is not None:
        err = err.cause  # type: ignore[attr-defined]
    return str(getattr(err, "message", None) or err)
