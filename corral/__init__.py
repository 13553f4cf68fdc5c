"""Corral: AI-agent episodes in containerd sandboxes, as durable Temporal workflows.

The face of the project for trainers: the SDK, the CLI, the models they write.
"""

from contract.errors import CorralError
from contract.models import (
    EgressRule,
    EpisodeResult,
    EpisodeSpec,
    FileSpec,
    Network,
    Resources,
    Step,
    StepResult,
    Timeouts,
)
from corral.errors import (
    CorralRPCError,
    EpisodeAlreadyExists,
    EpisodeCancelled,
    EpisodeEnded,
    EpisodeError,
    EpisodeFailed,
    EpisodeFileNotFound,
    EpisodeKilled,
    EpisodeNotFound,
    EpisodeQuarantined,
    EpisodeRejected,
    EpisodeRequestFailed,
    EpisodeRequestTimedOut,
    EpisodeTerminated,
    EpisodeTimedOut,
    EpisodeWaitTimedOut,
    InvalidEpisodeSpec,
)
from corral.sdk import Corral, Episode, EpisodeSummary
from workflows.models import EpisodeStatus

__all__ = [
    "Corral",
    "CorralError",
    "CorralRPCError",
    "EgressRule",
    "Episode",
    "EpisodeAlreadyExists",
    "EpisodeCancelled",
    "EpisodeEnded",
    "EpisodeError",
    "EpisodeFailed",
    "EpisodeFileNotFound",
    "EpisodeKilled",
    "EpisodeNotFound",
    "EpisodeQuarantined",
    "EpisodeRejected",
    "EpisodeRequestFailed",
    "EpisodeRequestTimedOut",
    "EpisodeResult",
    "EpisodeSpec",
    "EpisodeStatus",
    "EpisodeSummary",
    "EpisodeTerminated",
    "EpisodeTimedOut",
    "EpisodeWaitTimedOut",
    "FileSpec",
    "InvalidEpisodeSpec",
    "Network",
    "Resources",
    "Step",
    "StepResult",
    "Timeouts",
]
