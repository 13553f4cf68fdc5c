"""The node worker's snapshot collection loop and its retention setting."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from contract.config import ConfigError, load_config
from contract.errors import ContainerdUnavailable
from observability.metrics import parse_metrics, setup_metrics
from workers import node_worker

REPO = Path(__file__).resolve().parents[3]


def test_retention_defaults_to_an_hour_and_follows_the_environment(tmp_path: Path) -> None:
    assert load_config(REPO / "temporal-dev.yaml", env={}).nodes.snapshot_retention_s == 3600
    env = {"CORRAL_SNAPSHOT_RETENTION_S": "0"}
    assert load_config(REPO / "temporal-dev.yaml", env=env).nodes.snapshot_retention_s == 0
    path = tmp_path / "temporal-dev.yaml"
    path.write_text("nodes:\n  snapshot_retention_s: -1\n")
    with pytest.raises(ConfigError, match=r"nodes\.snapshot_retention_s"):
        load_config(path, env={})


class _FakeContainerd:
    connection = object()


def test_rounds_are_counted_and_a_failed_round_does_not_stop_the_loop(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    rounds: list[float] = []
    answers: list[Any] = [["a", "b"], ContainerdUnavailable("containerd is down"), [], ["c"]]

    async def fake_collect(conn: object, retention_s: float) -> list[str]:
        rounds.append(retention_s)
        answer = answers.pop(0) if answers else []
        if isinstance(answer, Exception):
            raise answer
        return list(answer)

    monkeypatch.setattr(node_worker, "collect_snapshots", fake_collect)
    metrics = setup_metrics("corral-test-snapshot-gc", prometheus_port=None)

    async def scenario() -> None:
        loop = asyncio.create_task(
            node_worker.collect_snapshots_forever(
                _FakeContainerd(),  # type: ignore[arg-type]
                "node-9",
                120.0,
                metrics,
                every_s=0.01,
            )
        )
        while answers:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        assert not loop.done()  # the failure was logged, not raised
        loop.cancel()

    try:
        with caplog.at_level("INFO", logger="corral.node"):
            asyncio.run(scenario())
        assert rounds[:4] == [120.0] * 4
        assert parse_metrics(metrics.exposition())["corral_snapshot_images_collected_total"] == 3
        assert "collected 2 snapshot images on node-9" in caplog.text
        assert "snapshot collection on node-9 failed" in caplog.text
        assert "containerd is down" in caplog.text
    finally:
        metrics.close()
