"""Corral's exception tree.

``CorralError`` is the one root every layer raises from; it lives here, in the
lowest layer, so that the sandbox layer can raise it without importing upward.
``corral`` re-exports it for trainers. Each subclass carries a one-line message
that names what was wrong.
"""

from __future__ import annotations


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
