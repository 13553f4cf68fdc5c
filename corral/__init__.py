"""Corral: AI-agent episodes in containerd sandboxes, as durable Temporal workflows.

The face of the project for trainers: the SDK, the CLI, the models they write.
"""

from corral.errors import (
    EpisodeCancelled,
    EpisodeError,
    EpisodeFailed,
    EpisodeKilled,
    EpisodeNotFound,
    EpisodeRejected,
    EpisodeTerminated,
    EpisodeTimedOut,
    InvalidEpisodeSpec,
)
from corral.sdk import Corral, Episode, EpisodeSummary
from sandbox.errors import CorralError
from workflows.models import (
    EgressRule,
    EpisodeResult,
    EpisodeSpec,
    EpisodeStatus,
    FileSpec,
    Network,
    Resources,
    Step,
    StepResult,
    Timeouts,
)

__all__ = [
    "Corral",
    "CorralError",
    "EgressRule",
    "Episode",
    "EpisodeCancelled",
    "EpisodeError",
    "EpisodeFailed",
    "EpisodeKilled",
    "EpisodeNotFound",
    "EpisodeRejected",
    "EpisodeResult",
    "EpisodeSpec",
    "EpisodeStatus",
    "EpisodeSummary",
    "EpisodeTerminated",
    "EpisodeTimedOut",
    "FileSpec",
    "InvalidEpisodeSpec",
    "Network",
    "Resources",
    "Step",
    "StepResult",
    "Timeouts",
]
