"""What the modules below ``client.py`` ask of the Containerd client, as Protocols.

``Sandbox`` (``sandbox.py``) keeps a back-reference to the client that made it,
and ``build_busybox_image`` (``oci_archive.py``) imports its archive through a
client's image store. Both type that client against the narrow Protocols here,
never against ``sandbox.client.Containerd``, so neither imports ``client.py``
and ``client.py`` may import them: no import circle (tests/unit/test_layering.py).
``Containerd`` satisfies every Protocol here structurally; mypy checks it where
the client passes itself (``Sandbox(self, ...)``) or is passed.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from sandbox.agent import AgentChannel
    from sandbox.models import ImageInfo


class SandboxHost(Protocol):
    """The client as a ``Sandbox`` sees it: its agent channels, teardown, network state."""

    @property
    def network_state_dir(self) -> Path:
        """``sandbox.network``'s state directory for this client's sandboxes."""
        ...

    def agent_channel(self, sandbox_id: str) -> AgentChannel | None:
        """The live exec-agent channel of a sandbox made by this process, or None."""
        ...

    async def attach_agent(self, sandbox_id: str) -> AgentChannel | None:
        """The channel of a sandbox whose agent another process started, or None."""
        ...

    async def destroy_sandbox(self, sandbox_id: str) -> bool:
        """Tear the sandbox down (network, task, container, snapshot, volume). Idempotent."""
        ...


class ArchiveImporter(Protocol):
    """An image store that imports OCI archives (``sandbox.images.ImageStore``)."""

    async def import_archive(self, path: Path) -> list[ImageInfo]: ...


class ImageClient(Protocol):
    """A client with an image store: what ``build_busybox_image`` imports into."""

    @property
    def images(self) -> ArchiveImporter: ...
