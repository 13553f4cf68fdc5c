"""Replay recorded episode histories against the current workflow code.

The histories in tests/data/histories/ were recorded from the real server by
tests/integration/episodes/test_episode_histories.py (CORRAL_RECORD_HISTORIES=1):
a scripted episode, an interactive one with Updates, a quarantine released by
on-call, and a kill by rule; kill_during_calls_hold.json is a stuck episode
from CI, cut at the workflow task that hung. A change to EpisodeWorkflow that would break
episodes in flight (a new, removed or reordered command) fails here; the last
test proves the check has teeth by replaying against a changed workflow.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import (
    Interceptor,
    Replayer,
    SignalChildWorkflowInput,
    StartActivityInput,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)
from temporalio.workflow import ActivityHandle, NondeterminismError

from contract.models import EpisodeResult
from workers.temporal import workflow_runner
from workflows.calls import CLOSE_SIGNAL, HOLD_SIGNAL
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


# What the episode asks of the world while replaying: (kind, name) in order.
_asked: list[tuple[str, str]] = []


class _Recorder(Interceptor):
    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor]:
        return _RecordingInbound


class _RecordingInbound(WorkflowInboundInterceptor):
    def init(self, outbound: WorkflowOutboundInterceptor) -> None:
        super().init(_RecordingOutbound(outbound))


class _RecordingOutbound(WorkflowOutboundInterceptor):
    async def signal_child_workflow(self, input: SignalChildWorkflowInput) -> None:
        _asked.append(("signal", input.signal))
        await super().signal_child_workflow(input)

    def start_activity(self, input: StartActivityInput) -> ActivityHandle[Any]:
        _asked.append(("activity", input.activity))
        return super().start_activity(input)


async def test_a_kill_that_meets_the_calls_hold_in_flight_ends_the_episode() -> None:
    """Recorded in CI (the drill's run-group path): a quarantine met the start of the
    episode's calls workflow, the episode sent it the hold, and on-call's kill came
    in the same workflow task as the hold's delivery. The SDK erases a cancellation
    that meets a finished signal, so the body went on waiting and the episode hung,
    killed but never closed. The history ends with that task: the episode must now
    close its calls workflow (its teardown follows once that is sent)."""
    _asked.clear()
    replayer = Replayer(
        workflows=[EpisodeWorkflow],
        data_converter=pydantic_data_converter,
        workflow_runner=workflow_runner(),
        interceptors=[_Recorder()],
    )
    # Its own id: the calls workflow's id is derived from it.
    path = HISTORIES / "kill_during_calls_hold.json"
    history = WorkflowHistory.from_json("ep-f9c09be51f0d4633-c888c00a-0", path.read_text())
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None
    held = _asked.index(("signal", HOLD_SIGNAL))
    assert ("signal", CLOSE_SIGNAL) in _asked[held:], _asked
