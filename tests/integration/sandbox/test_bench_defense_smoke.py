"""`corral bench --defense` end to end on a real containerd, tiny: every variant
is created, both density holds run twice, the ratios are there, nothing is left.
No timing is checked (the machines are noisy)."""

from __future__ import annotations

import pytest

from corral.bench.defense import DENSITY_ORDER, VARIANTS, measure_defense
from sandbox.client import Containerd
from sandbox.models import ImageInfo

pytestmark = pytest.mark.integration


async def test_defense_report_shape_and_cleanup(ctd: Containerd, busybox: ImageInfo) -> None:
    before = set(await ctd.container_ids())
    ticks: list[int] = []
    report = await measure_defense(ctd, n=2, density=3, tick=lambda: ticks.append(1))
    assert set(report.create_start_p50_ms) == set(VARIANTS)
    assert all(ms > 0 for ms in report.create_start_p50_ms.values())
    assert {v: len(runs) for v, runs in report.density.items()} == {
        v: DENSITY_ORDER.count(v) for v in set(DENSITY_ORDER)
    }
    assert all(
        run.created == 3 and run.failures == 0 for runs in report.density.values() for run in runs
    )
    assert set(report.ratios) >= {
        "create+start p50 defaults / off",
        "density creations per second defaults / off",
    }
    assert len(ticks) == 2 * len(VARIANTS) + 3 * len(DENSITY_ORDER)
    assert set(await ctd.container_ids()) == before
