"""Replay recorded episode histories against the current workflow code.

The histories in tests/data/histories/ were recorded from the real server by
tests/integration/episodes/test_episode_histories.py (CORRAL_RECORD_HISTORIES=1):
a scripted episode, an interactive one with Updates, a quarantine released by
on-call, and a kill by rule. A change to EpisodeWorkflow that would break
episodes in flight (a new, removed or reordered command) fails here; the last
test proves the check has teeth by replaying against a changed workflow.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

from activities.models import EpisodeResult
from workers.temporal import workflow_runner
from workflows.episode import EpisodeWorkflow
from workflows.models import EpisodeInput

HISTORIES = Path(__file__).resolve().parents[2] / "data" / "histories"
EXPECTED = {"scripted", "interactive", "quarantine_release", "kill", "snapshot", "hibernate"}


def _history(path: Path) -> WorkflowHistory:
    return WorkflowHistory.from_json(f"replay-{path.stem}", path.read_text())


def _replayer(*workflows: type) -> Replayer:
    return Replayer(
        workflows=list(workflows),
        data_converter=pydantic_data_converter,
        workflow_runner=workflow_runner(),
    )


def test_every_representative_history_is_recorded() -> None:
    assert {p.stem for p in HISTORIES.glob("*.json")} >= EXPECTED


@pytest.mark.parametrize("name", sorted(EXPECTED))
async def test_history_replays_against_current_code(name: str) -> None:
    result = await _replayer(EpisodeWorkflow).replay_workflow(_history(HISTORIES / f"{name}.json"))
    assert result.replay_failure is None


@workflow.defn(name="EpisodeWorkflow")
class _ChangedEpisodeWorkflow(EpisodeWorkflow):
    """The same workflow with one extra timer before provisioning."""

    @workflow.run
    async def run(self, input: EpisodeInput) -> EpisodeResult:
        await workflow.sleep(0.01)
        return await super().run(input)


async def test_a_nondeterministic_change_fails_replay() -> None:
    with pytest.raises(NondeterminismError):
        await _replayer(_ChangedEpisodeWorkflow).replay_workflow(
            _history(HISTORIES / "scripted.json")
        )
