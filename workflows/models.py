"""Inputs and state of Corral's workflows.

The data shared with activities (the episode spec, step results, activity
inputs) lives in `activities.models`, one layer down, and is re-exported
here so that callers import every workflow-facing model from one place.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from activities.models import (
    AlertSummary,
    EgressRule,
    EpisodeResult,
    EpisodeSpec,
    ExecRequest,
    ExecStepInput,
    FileContent,
    FileSpec,
    LoadInput,
    Network,
    NodeLoad,
    Outcome,
    ProvisionInput,
    ProvisionResult,
    ReadFileInput,
    ReadFileRequest,
    ReapInput,
    ReapResult,
    RecordEpisodeInput,
    Resources,
    SandboxRef,
    Step,
    StepResult,
    TeardownInput,
    TeardownResult,
    Timeouts,
    WriteFileInput,
    WriteFileRequest,
)

__all__ = [
    "AlertSummary",
    "CarriedState",
    "EgressRule",
    "EpisodeInput",
    "EpisodeResult",
    "EpisodeSpec",
    "EpisodeStatus",
    "ExecRequest",
    "ExecStepInput",
    "FileContent",
    "FileSpec",
    "LoadInput",
    "Network",
    "NodeLoad",
    "OnCallRequest",
    "Outcome",
    "ProvisionInput",
    "ProvisionResult",
    "ReadFileInput",
    "ReadFileRequest",
    "ReapInput",
    "ReapResult",
    "RecordEpisodeInput",
    "Resources",
    "SandboxRef",
    "Step",
    "StepResult",
    "TeardownInput",
    "TeardownResult",
    "Timeouts",
    "WriteFileInput",
    "WriteFileRequest",
]


class EpisodeInput(BaseModel):
    spec: EpisodeSpec
    nodes: list[str] = Field(min_length=1)
    node_task_queue_prefix: str = "corral-node-"
    node: str | None = None  # pin to a node (tests, on-call); else placement picks
    # Steps per run before continue-as-new; None is the workflow's default
    # (MAX_STEPS_PER_RUN). Tests set it small to exercise the hand-over.
    max_steps_per_run: int | None = Field(default=None, ge=1)
    # Carried over by continue-as-new; empty on the first run.
    carried: CarriedState | None = None


class CarriedState(BaseModel):
    sandbox_id: str
    node: str
    started_at: datetime
    provision_s: float
    steps: list[StepResult]
    next_index: int
    alerts: list[AlertSummary] = Field(default_factory=list)
    finishing: bool = False
    scripted_done: bool = False


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


EpisodeInput.model_rebuild()
