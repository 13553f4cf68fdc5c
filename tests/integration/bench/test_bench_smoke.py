"""`corral bench --peers` end to end on the session stack, at tiny sizes.

A smoke test, not a benchmark: every series runs and succeeds, the report
has its shape, and nothing the bench made is left behind. No timing is
asserted (the machine is shared and noisy).
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio

from contract.config import StackConfig
from corral.bench.core import SPACED_SERIES, Series
from corral.bench.peers import DOCKER_PEER, PODMAN_PEER, PeersReport, describe_peers, run_peers
from sandbox import Containerd
from tests.integration.conftest import wait_for
from workers.stack import Stack

pytestmark = pytest.mark.integration

N = 2
CONCURRENCY = 2
EXEC_N = 2
CTR_PEER = "ctr run --rm"
# Ids the bench gives what it makes outside Temporal: raw sandboxes
# (`bench-<tag>-<i>`), `ctr run` containers (`peer-...`) and its probe.
BENCH_ID_PREFIXES = ("bench-", "peer-", "probe-")
BENCH_LABELS = ("corral.bench", "corral.label.bench")


@dataclass
class BenchRun:
    report: PeersReport
    before: dict[str, set[str]]  # container ids per node before the bench


async def _containers(config: StackConfig) -> dict[str, dict[str, dict[str, str]]]:
    """Per node: every container id, with its labels when it is a sandbox."""
    held: dict[str, dict[str, dict[str, str]]] = {}
    for node in config.node_names():
        async with await Containerd.connect(
            str(config.containerd_socket(node)), namespace=config.nodes.containerd_namespace
        ) as client:
            ids = await client.container_ids()
            labels = {info.id: info.labels for info in await client.list_sandboxes()}
        held[node] = {cid: labels.get(cid, {}) for cid in ids}
    return held


def _bench_leftovers(
    before: dict[str, set[str]], now: dict[str, dict[str, dict[str, str]]]
) -> list[str]:
    left = []
    for node, containers in now.items():
        for cid, labels in containers.items():
            if cid in before.get(node, set()):
                continue
            if cid.startswith(BENCH_ID_PREFIXES) or any(k in labels for k in BENCH_LABELS):
                left.append(f"{node}/{cid}")
    return left


async def _bench_clean(config: StackConfig, before: dict[str, set[str]]) -> bool:
    return not _bench_leftovers(before, await _containers(config))


@pytest_asyncio.fixture(scope="module")
async def bench_run(stack: Stack) -> AsyncIterator[BenchRun]:
    config: StackConfig = stack.config
    before = {node: set(c) for node, c in (await _containers(config)).items()}
    report = await run_peers(config, n=N, concurrency=CONCURRENCY, exec_n=EXEC_N)
    yield BenchRun(report=report, before=before)
    # The last episode's deferred teardown may still be running: let it finish
    # so that the session's leak check does not race it when this module's
    # tests run alone (test_bench_leaves_nothing_behind reports a real leak).
    with contextlib.suppress(AssertionError):
        await wait_for(lambda: _bench_clean(config, before), timeout_s=60)


def _expected_count(series: Series) -> int:
    per_exec = ("raw exec round trip", "through a Temporal Update", "warm acquire")
    return EXEC_N if any(part in series.name for part in per_exec) else N


def _ctr_available() -> bool:
    return shutil.which("ctr") is not None


async def test_bench_peers_report_shape(bench_run: BenchRun) -> None:
    report = bench_run.report
    for bench in (report.corral, report.corral_cold):
        names = [s.name for s in bench.series]
        assert SPACED_SERIES in names, names
        assert "episode through Temporal (spaced)" in names
        for series in bench.series:
            assert series.count == _expected_count(series), series
            assert series.failures == 0, series

    assert "episode throughput / raw throughput" in report.ratios, report.ratios
    assert "update exec p50 / raw exec p50" in report.ratios, report.ratios

    peers = {p.name: p for p in report.peers}
    if _ctr_available():
        ctr = peers[CTR_PEER]
        assert ctr.available, ctr.skipped_because
        assert ctr.spaced is not None
        assert ctr.spaced.count == N and ctr.spaced.failures == 0, ctr.spaced
        assert "episode p50 / ctr p50" in report.ratios, report.ratios
        assert "spaced episode p50 / spaced ctr p50" in report.ratios, report.ratios
    # The bench brings both engines (a private dockerd, podman on storage of its
    # own) wherever they are installed, as scripts/setup.sh does.
    for name, binary, key in (
        (PODMAN_PEER, "podman", "podman"),
        (DOCKER_PEER, "dockerd", "docker"),
    ):
        peer = peers[name]
        if shutil.which(binary) is None:
            assert peer.skipped_because, peer
            continue
        assert peer.available, f"{name}: {peer.skipped_because}"
        for series in (peer.sequential, peer.concurrent, peer.spaced):
            assert series is not None and series.count == N and series.failures == 0, series
        assert f"episode throughput / {key} throughput" in report.ratios, report.ratios

    for key in ("temporal server", "workflow worker", "node worker", "containerd"):
        assert key in report.cpu_ms_per_episode, report.cpu_ms_per_episode


async def test_bench_leaves_nothing_behind(stack: Stack, bench_run: BenchRun) -> None:
    config: StackConfig = stack.config
    left: list[str] = []

    async def clean() -> bool:
        nonlocal left
        left = _bench_leftovers(bench_run.before, await _containers(config))
        return not left

    try:
        # Deferred teardowns run up to ~1 s after an episode returns.
        await wait_for(clean, timeout_s=60)
    except AssertionError as err:
        raise AssertionError(f"the bench left containers behind: {left}") from err


async def test_describe_peers_lists_spaced_ctr(bench_run: BenchRun) -> None:
    lines = describe_peers(bench_run.report)
    assert any(line.startswith("== peers") for line in lines)
    if _ctr_available():
        assert any(line.startswith(f"{CTR_PEER} (spaced)") for line in lines), lines
