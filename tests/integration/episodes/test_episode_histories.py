"""Representative episodes whose event histories the replay tests replay.

Each test drives one kind of episode through the real stack and checks it. With
CORRAL_RECORD_HISTORIES=1 it also writes the episode's event history (the
standard Temporal JSON, what `temporal workflow show --output json` prints) to
tests/data/histories/<name>.json, for tests/unit/workflows/test_replay.py:

    CORRAL_RECORD_HISTORIES=1 .venv/bin/pytest -q \
        tests/integration/episodes/test_episode_histories.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from episode_helpers import eventually, sandbox_exists

from contract.config import StackConfig
from corral.errors import EpisodeKilled
from corral.sdk import Corral, Episode
from policies.alert import ANOMALY_SIGNAL
from tests.alerts import anomaly_signal

pytestmark = pytest.mark.integration

HISTORIES = Path(__file__).resolve().parents[2] / "data" / "histories"


async def _record(corral: Corral, episode: Episode, name: str) -> None:
    if os.environ.get("CORRAL_RECORD_HISTORIES") != "1":
        return
    history = await corral.client.get_workflow_handle(episode.id).fetch_history()
    HISTORIES.mkdir(parents=True, exist_ok=True)
    data = json.loads(history.to_json())
    (HISTORIES / f"{name}.json").write_text(json.dumps(data, indent=1) + "\n")


async def test_scripted_history(corral: Corral) -> None:
    spec = {
        "image": "busybox",
        "files": [{"path": "/tmp/a", "content": "x"}],
        "steps": ["cat /tmp/a", "echo err >&2"],
        "reward": "echo 1",
    }
    episode = await corral.start_episode(spec, episode_id=f"hist-scripted-{os.getpid()}")
    assert (await episode.result()).outcome == "completed"
    await _record(corral, episode, "scripted")


async def test_interactive_history(corral: Corral) -> None:
    spec = {"image": "busybox", "interactive": True, "steps": ["true"], "reward": "cat /tmp/r"}
    episode = await corral.start_episode(spec, episode_id=f"hist-interactive-{os.getpid()}")
    assert (await episode.exec("echo hi")).stdout == "hi\n"
    await episode.write_file("/tmp/r", "0.25\n")
    assert await episode.read_file("/tmp/r") == b"0.25\n"
    final = await episode.finish()
    assert final.reward is not None and final.reward.stdout == "0.25\n"
    await _record(corral, episode, "interactive")


async def test_quarantine_then_release_history(corral: Corral, stack_config: StackConfig) -> None:
    spec = {"image": "busybox", "interactive": True, "reward": "echo done"}
    episode = await corral.start_episode(spec, episode_id=f"hist-quarantine-{os.getpid()}")
    await episode.exec("echo before")
    handle = corral.client.get_workflow_handle(episode.id)
    await handle.signal(ANOMALY_SIGNAL, anomaly_signal("Test suspicious shell", "quarantine"))

    async def quarantined() -> bool:
        return (await episode.status()).quarantined

    await eventually(quarantined, what="episode quarantined")
    status = await episode.status()
    assert status.state == "quarantined" and status.anomaly_rules == ["Test suspicious shell"]
    assert await sandbox_exists(stack_config, status.sandbox_id)  # kept for forensics

    async def listed() -> bool:
        rows = await corral.list_episodes(
            f"EpisodeState = 'quarantined' AND WorkflowId = '{episode.id}'"
        )
        return len(rows) == 1 and rows[0].anomaly_rules == ["Test suspicious shell"]

    await eventually(listed, what="quarantine visible in search attributes")

    await episode.release(reason="false positive", by="oncall")

    async def running() -> bool:
        return (await episode.status()).state == "running"

    await eventually(running, what="episode released")
    assert (await episode.exec("echo after")).stdout == "after\n"  # thawed
    final = await episode.finish()
    assert final.outcome == "completed"
    assert [a.action for a in final.alerts] == ["quarantine"]
    await _record(corral, episode, "quarantine_release")


async def test_kill_history(corral: Corral, stack_config: StackConfig) -> None:
    spec = {"image": "busybox", "interactive": True}
    episode = await corral.start_episode(spec, episode_id=f"hist-kill-{os.getpid()}")
    await episode.exec("true")
    await corral.client.get_workflow_handle(episode.id).signal(
        ANOMALY_SIGNAL, anomaly_signal("Test crypto miner", "kill")
    )
    with pytest.raises(EpisodeKilled, match="killed by rule 'Test crypto miner'") as caught:
        await episode.result()
    assert caught.value.rule == "Test crypto miner"
    assert caught.value.result is not None
    assert not await sandbox_exists(stack_config, caught.value.result.sandbox_id)
    await _record(corral, episode, "kill")


async def test_on_call_kill_while_quarantined(corral: Corral, stack_config: StackConfig) -> None:
    episode = await corral.start_episode({"image": "busybox", "interactive": True})
    await episode.exec("true")
    handle = corral.client.get_workflow_handle(episode.id)
    await handle.signal(ANOMALY_SIGNAL, anomaly_signal("Test odd write", "quarantine"))

    async def quarantined() -> bool:
        return (await episode.status()).quarantined

    await eventually(quarantined, what="episode quarantined")
    await episode.kill(reason="confirmed", by="bob")
    with pytest.raises(EpisodeKilled, match="by bob: confirmed") as caught:
        await episode.result()
    assert caught.value.result is not None
    assert not await sandbox_exists(stack_config, caught.value.result.sandbox_id)
