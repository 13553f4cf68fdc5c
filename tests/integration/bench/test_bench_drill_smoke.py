"""`corral bench --sensor --drill` at a tiny size on the session stack.

A smoke test, not the detection suite (tests/integration/detection/): two
cases and the benign corpus on two paths; the report has its JSON keys, its
numbers add up, and every episode the drill made is gone. Nothing is asserted
about what was caught or how fast (that is the detection suite's and the
bench's business).
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from corral.bench.drill import DrillReport, describe, run_drill
from corral.bench.drill_cases import case_named
from tests.integration.conftest import sandboxes_left, wait_for
from workers.stack import Stack

pytestmark = pytest.mark.integration

PATHS = ("cold-lean", "cold-interactive")
CASES = ("bin-write", "runtime-socket")
KEYS = ("caught_ratio", "false_alarms", "frozen_p50_ms", "frozen_p99_ms")


async def test_drill_report_keys_and_sums(stack: Stack) -> None:
    ticks = 0

    def tick() -> None:
        nonlocal ticks
        ticks += 1

    report = await run_drill(
        stack.config,
        paths=PATHS,
        cases=[case_named(c) for c in CASES],
        batch_n=1,
        tick=tick,
    )
    data = json.loads(report.model_dump_json())
    for key in KEYS:
        assert key in data, data.keys()
    assert set(data["paths"]) == set(PATHS)
    for path in data["paths"].values():
        for key in KEYS:
            assert key in path, path.keys()

    # One tick and one run per job per path: each case, and the benign corpus.
    jobs = len(CASES) + 1
    assert ticks == len(PATHS) * jobs
    assert len(report.runs) == len(PATHS) * jobs
    assert report.cases == len(PATHS) * len(CASES)
    assert report.caught == sum(p.caught for p in report.paths.values())
    assert report.false_alarms == sum(p.false_alarms for p in report.paths.values())
    assert report.stray_alerts == sum(p.stray_alerts for p in report.paths.values())
    assert report.stray_alerts == sum(r.stray_alerts for r in report.runs)
    assert report.caught_ratio == pytest.approx(report.caught / report.cases, abs=1e-3)
    for name, path in report.paths.items():
        assert path.cases == len(CASES)
        assert 0 <= path.caught <= path.cases
        assert path.caught_ratio == pytest.approx(path.caught / path.cases, abs=1e-3)
        runs = [r for r in report.runs if r.path == name]
        assert path.caught == sum(1 for r in runs if r.caught)
        assert len(path.missed) == sum(1 for r in runs if r.caught is False or r.false_alarms)
        if path.frozen_p50_ms is not None:
            assert path.frozen_p99_ms is not None and path.frozen_p50_ms <= path.frozen_p99_ms
    if report.frozen_p50_ms is not None:
        assert report.frozen_p99_ms is not None and report.frozen_p50_ms <= report.frozen_p99_ms
    assert report.frozen_source in ("sensor", "episode", "mixed", "none")
    assert any(line.startswith("all") for line in describe(report))
    DrillReport.model_validate(data)  # the JSON reads back

    async def gone() -> bool:
        return not await sandboxes_left(stack.config)

    await wait_for(gone, timeout_s=60)  # every episode the drill made was ended


def test_drill_needs_sensor_mode() -> None:
    from corral.cli import _register, cli

    _register()  # what corral.cli.main does before it runs the group
    result = CliRunner().invoke(cli, ["bench", "--drill"])
    assert result.exit_code != 0
    assert "--sensor" in result.output
