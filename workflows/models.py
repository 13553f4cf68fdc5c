"""Inputs and state of Corral's workflows.

The data shared with activities (the episode spec, step results, activity
inputs) lives in the contract, `contract.models`; import it from there (no
re-exports: each model has one home).
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from contract.models import (
    AdmissionPolicy,
    AlertSummary,
    EpisodeSpec,
    Outcome,
    StepResult,
)
from policies.alert import Alert
from policies.responses import Decision


class EpisodeInput(BaseModel):
    spec: EpisodeSpec
    node_task_queue_prefix: str = "corral-node-"
    node: str | None = None  # pin to a node (tests, on-call); else placement picks
    # Steps per run before continue-as-new; None is the workflow's default
    # (MAX_STEPS_PER_RUN). Tests set it small to exercise the hand-over.
    max_steps_per_run: int | None = Field(default=None, ge=1)
    # The tenant's quota, for the admission workflow: set by the SDK only for a
    # tenant that has one (others never wait for admission).
    admission: AdmissionPolicy | None = None
    # Carried over by continue-as-new; empty on the first run.
    carried: EpisodeState | None = None


class KillOrder(BaseModel):
    """Why the episode must end now: a rule, on-call, a timer or a lost node."""

    reason: str
    rule: str | None = None
    outcome: Outcome = "killed"


class EpisodeState(BaseModel):
    """Everything `EpisodeWorkflow` knows, in one object.

    It is also what continue-as-new carries to the next run, so nothing the
    episode knows is lost at the hand-over (the step log keeps its shape but
    drops outputs, which stay in the earlier run's history). The field names of
    the first version (`finishing`, `scripted_done`, ...) are kept so that
    recorded histories still load.
    """

    state: str = "pending"
    sandbox_id: str = ""
    node: str = ""
    started_at: datetime | None = None
    provision_s: float = 0.0
    steps: list[StepResult] = Field(default_factory=list)
    next_index: int = 0
    alerts: list[AlertSummary] = Field(default_factory=list)
    scripted_done: bool = False
    finishing: bool = False  # the trainer asked to finish (reward, then end)
    ready: bool = False  # the sandbox is up and its files written
    quarantined: bool = False
    release_requested: bool = False
    pending_quarantines: list[Decision] = Field(default_factory=list)
    kill: KillOrder | None = None
    closing: bool = False
    torn_down: bool = False  # a lean run's node destroyed the sandbox itself
    admission_held: bool = False  # the episode holds room in its tenant's quota
    node_lost: bool = False  # the node went away with the sandbox: nothing to tear down
    snapshots: list[str] = Field(default_factory=list)  # refs of the snapshots taken
    # Idle past timeouts.hibernate_after_s: the sandbox was snapshotted to this
    # ref and freed; the next request provisions it again from the ref.
    hibernated_ref: str = ""
    # Every hibernation's snapshot: internal, removed from the node at teardown.
    hibernations: list[str] = Field(default_factory=list)
    reason: str = ""
    queue_position: int = 0  # waiting for a node: place in the line, 1 = next
    last_activity: datetime | None = None
    # Per run: bumped by every request (resets the idle timer), counted for
    # continue-as-new, set when the body stopped so that the next run goes on.
    activity_seq: int = 0
    steps_this_run: int = 0
    continue_due: bool = False

    def next_run(self) -> EpisodeState:
        """The state a continued run starts from: the sandbox is up and running."""
        return self.model_copy(
            update={
                "state": "running",
                "ready": True,
                "steps_this_run": 0,
                "continue_due": False,
                "closing": False,
            }
        )

    def carried(self) -> EpisodeState:
        """What continue-as-new hands over: outputs stay in this run's history."""
        return self.model_copy(update={"steps": [step.summary() for step in self.steps]})

    @property
    def rules(self) -> list[str]:
        return sorted({alert.rule for alert in self.alerts})


class AnomalySignal(BaseModel):
    """The `anomaly` signal the intake sends: the Falco alert and the decision on it."""

    alert: Alert
    decision: Decision


class OnCallRequest(BaseModel):
    """The input of the `release` and `kill` signals: who acted and why."""

    model_config = ConfigDict(extra="forbid")
    reason: str = ""
    by: str = ""


class EpisodeStatus(BaseModel):
    episode_id: str
    state: str
    node: str
    sandbox_id: str
    image: str
    tenant: str
    steps_done: int
    anomaly_rules: list[str]
    quarantined: bool
    last_activity: datetime | None
    reason: str = ""
    queue_position: int = 0  # waiting for a node: place in the line, 1 = next; 0 = not waiting


EpisodeInput.model_rebuild()
