"""The exceptions a trainer handles; all derive from `CorralError`.

Three families: the request never reached an episode (`InvalidEpisodeSpec`,
`EpisodeNotFound`, `CorralRPCError`); the episode took no more requests
(`EpisodeRejected`: `EpisodeEnded`, `EpisodeQuarantined`); a request reached
the sandbox and failed there (`EpisodeRequestFailed`: `EpisodeFileNotFound`,
...); and the episode ended without completing (`EpisodeError`, raised by
`result()`). Timeouts are also `TimeoutError`s, a missing file also a
`FileNotFoundError`, so plain Python handlers catch them too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from contract.errors import CorralError

if TYPE_CHECKING:
    from temporalio.service import RPCError

    from contract.models import EpisodeResult


class InvalidEpisodeSpec(CorralError):
    """The spec was rejected before anything started; the message names the field."""


class EpisodeNotFound(CorralError):
    """No episode with that id."""


class EpisodeAlreadyExists(CorralError):
    """An episode with that id exists already (ids are unique, also after it ended)."""


class CorralRPCError(CorralError):
    """Temporal answered an SDK call with an error Corral has no better name for."""

    def __init__(self, message: str, rpc_error: RPCError | None = None) -> None:
        super().__init__(message)
        self.rpc_error = rpc_error

    @property
    def status(self) -> str | None:
        """The gRPC status name (`UNAVAILABLE`, ...), when Temporal sent one."""
        if self.rpc_error is None or self.rpc_error.status is None:
            return None
        return self.rpc_error.status.name


class EpisodeRejected(CorralError):
    """The episode refused a request (not interactive, finishing, ended, quarantined)."""


class EpisodeEnded(EpisodeRejected):
    """A request reached an episode that has ended; `outcome` and `reason` say how."""

    def __init__(self, episode_id: str, outcome: str, reason: str) -> None:
        super().__init__(f"episode {episode_id} has ended: {outcome}: {reason or 'no reason'}")
        self.episode_id = episode_id
        self.outcome = outcome
        self.reason = reason


class EpisodeQuarantined(EpisodeRejected):
    """The episode is quarantined: it takes requests again once on-call releases it."""


class EpisodeRequestFailed(CorralError):
    """An interactive request reached the sandbox and failed there.

    `error_type` is the sandbox layer's error class name (`SandboxPaused`, ...).
    """

    def __init__(self, message: str, error_type: str = "") -> None:
        super().__init__(message)
        self.error_type = error_type


class EpisodeFileNotFound(EpisodeRequestFailed, FileNotFoundError):
    """`read_file` named a path that is not a file in the sandbox."""


class EpisodeRequestTimedOut(EpisodeRequestFailed, TimeoutError):
    """The request's activity ran out of time (a step's own timeout is no error:
    its `StepResult` has `timed_out=True`)."""


class EpisodeWaitTimedOut(CorralError, TimeoutError):
    """`result(timeout_s=...)` gave up waiting; the episode still runs."""


class EpisodeError(CorralError):
    """The episode ended without completing; `result` holds what it did."""

    outcome = "failed"

    def __init__(self, message: str, result: EpisodeResult | None = None) -> None:
        super().__init__(message)
        self.result = result


class EpisodeFailed(EpisodeError):
    """A step or the reward failed, or provisioning did (bad image, no node)."""


class EpisodeKilled(EpisodeError):
    """A response rule or on-call killed the episode; `rule` names the Falco rule."""

    outcome = "killed"

    @property
    def rule(self) -> str | None:
        if self.result is None or not self.result.alerts:
            return None
        kills = [a.rule for a in self.result.alerts if a.action in ("kill", "quarantine")]
        return kills[-1] if kills else None


class EpisodeTimedOut(EpisodeError, TimeoutError):
    """Idle TTL or maximum lifetime ran out."""

    outcome = "timed_out"


class EpisodeCancelled(EpisodeError):
    """The episode was cancelled (its sandbox is torn down)."""

    outcome = "cancelled"


class EpisodeTerminated(EpisodeError):
    """The workflow was terminated; the janitor reaps its sandbox."""

    outcome = "terminated"


class EpisodeNotAdmitted(EpisodeError, EpisodeRejected):
    """A tenant rule refused the spec before anything started, or the tenant's
    quota refused the episode (`on_quota: reject`); the message names which."""

    outcome = "rejected"
