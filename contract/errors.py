"""Corral's exception tree.

``CorralError`` is the one root every layer raises from; it lives in the
contract, below every layer, so that the sandbox layer can raise it without
importing upward. ``corral`` exports it to trainers with their own errors.
Each subclass carries a one-line message that names what was wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


class CorralError(Exception):
    """Root of every error Corral raises on purpose."""


class SandboxError(CorralError):
    """Something went wrong in the sandbox layer (containerd, runc, the spec)."""


class InvalidSpec(SandboxError):
    """A sandbox or exec request was malformed; nothing was created."""


class ImageNotFound(SandboxError):
    """The image is not in containerd's image store."""


class SandboxNotFound(SandboxError):
    """No sandbox with that id exists."""


class SandboxAlreadyExists(SandboxError):
    """A sandbox with that id exists already."""


class SandboxPaused(SandboxError):
    """The sandbox is paused (frozen): exec and file transfer are refused."""


class ContainerdUnavailable(SandboxError):
    """containerd did not answer on its socket."""


class ContainerdError(SandboxError):
    """containerd answered with an error that has no more specific type."""


class SandboxStartFailed(SandboxError):
    """The sandbox could not be created or started; everything made was rolled back."""


class SandboxStateError(SandboxError):
    """The sandbox (or a process in it) is in a state that refuses the request."""


class ExecFailed(SandboxError):
    """A command could not be started inside the sandbox (not: it exited non-zero)."""


class ImageImportFailed(SandboxError):
    """An image archive could not be read or imported."""


class NetworkError(SandboxError):
    """Sandbox network plumbing (veth, addresses, nftables) failed; the message names the step."""


class ImageBuildError(SandboxError):
    """Building an image (debootstrap, apt, layer tarballs) failed; the message names the step."""


class FileNotFound(SandboxError):
    """`read_file` named a path that is not a regular file in the sandbox."""


class SnapshotFailed(SandboxError):
    """Committing a sandbox's writable layer failed; the message names the step."""


# --------------------------------------------------------------------------
# Error kinds: what crosses Temporal
# --------------------------------------------------------------------------
# A failure reaches another process as an `ApplicationError` whose `type` is a
# kind's name (the sandbox layer's errors use their class name). What each kind
# means to the receiver is data here, read by the retry policy
# (workflows/steps.py), the episode, and the SDK (corral/sdk.py), so no layer
# decides it from a message's text.


@dataclass(frozen=True)
class ErrorKind:
    """How a failure of this kind is treated where it lands."""

    name: str
    retryable: bool = True  # another attempt of an activity failing so may succeed
    lost_step: bool = False  # the step was lost with its sandbox, containerd or node
    refusal: bool = False  # the episode refused the request: nothing ran
    hand_over: bool = False  # sent to the wrong one of an episode's two workflows
    ends_episode: bool = False  # the episode's own failure type (its result in the details)


def _kinds(*kinds: ErrorKind) -> dict[str, ErrorKind]:
    return {kind.name: kind for kind in kinds}


ERROR_KINDS: dict[str, ErrorKind] = _kinds(
    # The sandbox layer's, from node activities: no retry fixes a bad request or
    # a missing image; a step lost with its sandbox is reported, not run again.
    # The node retries only the sandbox errors listed here as retryable (containerd
    # down or restarting, a start rolled back); one not listed is a bad request.
    ErrorKind("InvalidSpec", retryable=False),
    ErrorKind("ImageNotFound", retryable=False),
    ErrorKind("ImagePullFailed", retryable=False),
    ErrorKind("InvalidReference", retryable=False),
    ErrorKind("SandboxPaused", retryable=False),
    ErrorKind("SandboxNotFound", retryable=False, lost_step=True),
    ErrorKind("ContainerdUnavailable", lost_step=True),
    ErrorKind("ContainerdError", lost_step=True),
    ErrorKind("SandboxStartFailed"),  # rolled back (runc under memory pressure, a late shim)
    # A node's answers.
    ErrorKind("NodeFull"),  # placed again later, on another node or this one
    ErrorKind("EpisodeClosed"),  # a lean run that arrived after its episode's teardown
    ErrorKind("AgentUnavailable"),  # the sandbox's exec agent did not answer
    ErrorKind("StepFailed"),  # a scripted step the episode could not run
    ErrorKind("RequestFailed"),  # an Update's activity failed with no typed cause
    ErrorKind("IdleTimeout"),  # an interactive episode nobody called for its idle TTL
    ErrorKind("JanitorFailed"),
    ErrorKind("NodeStopping"),  # a node worker's presence, at its shutdown (non_retryable itself)
    # The episode's refusals of a request (Update validators raise ValueError).
    ErrorKind("ValueError", refusal=True),
    ErrorKind("InvalidRequest", refusal=True),
    ErrorKind("EpisodeFinishing", refusal=True),
    ErrorKind("EpisodeEnded", refusal=True),  # details: {"outcome", "reason"}
    ErrorKind("EpisodeQuarantined", refusal=True),
    # A tool call that met the hand-over between the episode and its calls
    # workflow (workflows/calls.py): the SDK sends it to the other one.
    ErrorKind("CallsOnNode", hand_over=True),  # the episode: ask the calls workflow
    ErrorKind("CallsClosed", hand_over=True),  # the calls workflow: ask the episode
    # How an episode ends when it does not complete (details: its result).
    ErrorKind("EpisodeKilled", ends_episode=True),
    ErrorKind("EpisodeTimedOut", ends_episode=True),
    ErrorKind("EpisodeRejected", refusal=True, ends_episode=True),  # `on_quota: reject`
    ErrorKind("EpisodeFailed", ends_episode=True),
)


def kinds_where(predicate: Callable[[ErrorKind], bool]) -> tuple[str, ...]:
    """The names of the kinds that satisfy `predicate`, in the table's order
    (a retry policy's list is part of the commands a history records)."""
    return tuple(name for name, kind in ERROR_KINDS.items() if predicate(kind))
