"""End to end: every misbehaviour of corral/drill_cases.py on every episode path,
on a stack with the warm pool on (conftest.py), through the real sensors, the
intake and the episode workflow.

Each (case, path) asserts the rule of the alert, the process it names
(``proc.name`` as at the syscall) and the episode's end state (killed,
quarantined or notified, per policies/responses.yaml). The benign corpus
raises nothing at Error or Critical on any path. The episodes of one path run
once for all of its tests (`path_runs`), a few at a time, by the same code as
`corral bench --sensor --drill` (corral/bench_drill.py).
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from corral.bench_drill import BENIGN_JOB, Drill, Job, RunRecord, benign_job
from corral.drill_cases import CASES, PATHS, Case, runnable_cases
from corral.sdk import Corral

pytestmark = pytest.mark.integration

WARM_PATHS = ("warm-interactive", "warm-lean", "stepwise", "hibernate-wake", "batch")
COLD_PATHS = ("cold-interactive", "cold-lean")
BATCH_N = 2


class PathRuns:
    """Runs each path's jobs once (the first test that asks), then serves the records."""

    def __init__(self, corral: Corral) -> None:
        self.drill = Drill(corral, concurrency=4, batch_n=BATCH_N)
        self.jobs = [Job.of(c) for c in runnable_cases()] + [benign_job()]
        self._runs: dict[str, asyncio.Task[list[RunRecord]]] = {}

    async def get(self, path: str) -> list[RunRecord]:
        if path not in self._runs:
            self._runs[path] = asyncio.ensure_future(self.drill.run_path(path, self.jobs))
        return await self._runs[path]

    async def of(self, path: str, job: str) -> list[RunRecord]:
        records = [r for r in await self.get(path) if r.job == job]
        assert records, f"{path}: no episode ran {job}"
        return records


@pytest_asyncio.fixture(scope="session")
async def path_runs(warm_corral: Corral) -> AsyncIterator[PathRuns]:
    runs = PathRuns(warm_corral)
    yield runs
    for task in runs._runs.values():  # every episode ended before the leak check
        if not task.done():
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def _describe(record: RunRecord) -> str:
    alerts = ", ".join(f"{a.rule} [{a.action}, process={a.process}]" for a in record.alerts)
    return (
        f"{record.path}/{record.job} episode {record.episode_id} (warm={record.warm}, "
        f"node={record.node}): ended {record.end_state} {record.reason!r}; "
        f"alerts: {alerts or 'none'}; {record.why or record.error}"
    )


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_misbehaviour_is_caught(path_runs: PathRuns, path: str, case: Case) -> None:
    if case.skip:
        pytest.skip(case.skip)
    for record in await path_runs.of(path, case.name):
        assert not record.error, _describe(record)
        ours = [a for a in record.alerts if a.rule == case.rule]
        assert ours, _describe(record)
        assert {a.process for a in ours} == {case.process}, _describe(record)
        assert record.end_state == case.end, _describe(record)
        assert record.caught, _describe(record)


@pytest.mark.parametrize("path", PATHS)
async def test_benign_corpus_raises_nothing_at_error(path_runs: PathRuns, path: str) -> None:
    for record in await path_runs.of(path, BENIGN_JOB):
        assert not record.error, _describe(record)
        assert record.end_state in ("completed", "notified"), _describe(record)
        assert record.false_alarms == 0, _describe(record)


@pytest.mark.parametrize("path", WARM_PATHS)
async def test_warm_paths_ran_on_pool_sandboxes(path_runs: PathRuns, path: str) -> None:
    """The pool's shape is served warm: this suite tests the claimed-sandbox paths."""
    records = [r for r in await path_runs.get(path) if r.warm is not None]
    assert records, f"{path}: no run told its sandbox"
    warm = sum(1 for r in records if r.warm)
    # Concurrent claims may drain a node's pool for a moment (it then provisions
    # cold): most runs, not every one, come from the pool.
    assert warm >= len(records) / 2, f"{path}: only {warm} of {len(records)} runs were warm"


@pytest.mark.parametrize("path", COLD_PATHS)
async def test_cold_paths_never_claim_the_pool(path_runs: PathRuns, path: str) -> None:
    records = await path_runs.get(path)
    assert not [r.episode_id for r in records if r.warm], f"{path}: a cold spec ran warm"


def _debian_image() -> Path | None:
    """A Debian image with python3/git/gcc already built in the cache (none is built here)."""
    cache = Path(__file__).resolve().parents[3] / ".cache" / "debian"
    done = sorted(cache.glob("img-*/image.json")) if cache.is_dir() else []
    return done[0] if done else None


def test_benign_work_on_debian() -> None:
    if _debian_image() is None or not shutil.which("debootstrap"):
        pytest.skip(
            "no Debian image on the detection stack: the suite's stacks hold busybox only, and "
            "building one (debootstrap + apt, network, minutes) is outside a 3-minute suite; "
            "pip/venv installs offline are not possible either"
        )
    pytest.skip("a cached Debian image exists but importing it into the stack is not wired here")
