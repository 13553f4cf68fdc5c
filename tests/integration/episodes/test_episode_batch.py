"""A 200-episode batch through `Corral.run_batch`: every result back, nothing left."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from episode_helpers import eventually, sandbox_ids

from contract.config import StackConfig
from corral.sdk import Corral

pytestmark = pytest.mark.integration

N = 200


async def test_batch_of_200_leaves_no_sandbox(corral: Corral, stack_config: StackConfig) -> None:
    before = await sandbox_ids(stack_config)
    spec = {
        "image": "busybox",
        "steps": ["echo $((6 * 7))"],
        "reward": "echo 1",
        "labels": {"batch": "b200"},
    }
    started = time.monotonic()
    results = [r async for r in corral.run_batch(spec, n=N, concurrency=32, id_prefix="b200")]
    wall_s = time.monotonic() - started

    assert len(results) == N
    assert len({r.episode_id for r in results}) == N
    outcomes = Counter(r.outcome for r in results)
    # Every episode completes: a kill here would be a sensor false positive
    # (echo-only sandboxes), and its alert is in the message.
    not_completed = [
        (r.episode_id, r.outcome, r.reason, [a.output[:300] for a in r.alerts])
        for r in results
        if r.outcome != "completed"
    ]
    assert not not_completed, not_completed
    assert all(r.steps[0].stdout == "42\n" for r in results if r.outcome == "completed")
    assert {r.node for r in results} == set(stack_config.node_names())

    async def all_removed() -> bool:  # lean runs tear down just after their result
        # Nothing beyond what was there before (which the janitor may reap meanwhile).
        now = await sandbox_ids(stack_config)
        return all(not ids - before.get(node, set()) for node, ids in now.items())

    await eventually(all_removed, what="every sandbox of the batch removed")
    print(f"\nbatch: {N} episodes in {wall_s:.1f} s = {N / wall_s:.1f} episodes/s, {outcomes}")


async def test_batch_yields_failures_without_stopping(corral: Corral) -> None:
    spec = {"image": "busybox", "steps": ["test $(( $(date +%N) % 1 )) -eq 1"]}  # always fails
    results = [r async for r in corral.run_batch(spec, n=6, concurrency=3)]
    assert len(results) == 6
    assert {r.outcome for r in results} == {"failed"}
    assert all("step 0" in r.reason for r in results)
