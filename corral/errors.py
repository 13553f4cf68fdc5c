"""The exceptions a trainer handles; all derive from `CorralError`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandbox.errors import CorralError

if TYPE_CHECKING:
    from workflows.models import EpisodeResult


class InvalidEpisodeSpec(CorralError):
    """The spec was rejected before anything started; the message names the field."""


class EpisodeNotFound(CorralError):
    """No episode with that id."""


class EpisodeRejected(CorralError):
    """The episode refused a request (finished, finishing, quarantined, killed)."""


class EpisodeError(CorralError):
    """The episode ended without completing; `result` holds what it did."""

    def __init__(self, message: str, result: EpisodeResult | None = None) -> None:
        super().__init__(message)
        self.result = result


class EpisodeFailed(EpisodeError):
    """A step or the reward failed, or provisioning did (bad image, no node)."""


class EpisodeKilled(EpisodeError):
    """A response rule or on-call killed the episode; `rule` names the Falco rule."""

    @property
    def rule(self) -> str | None:
        if self.result is None or not self.result.alerts:
            return None
        kills = [a.rule for a in self.result.alerts if a.action in ("kill", "quarantine")]
        return kills[-1] if kills else None


class EpisodeTimedOut(EpisodeError):
    """Idle TTL or maximum lifetime ran out."""


class EpisodeCancelled(EpisodeError):
    """The episode was cancelled (its sandbox is torn down)."""


class EpisodeTerminated(EpisodeError):
    """The workflow was terminated; the janitor reaps its sandbox."""
