"""Which episode owns a container, without touching any node's containerd.

The intake runs on the control plane, and nodes may be other hosts: it must
not open their containerd sockets. Two sources, in order:

1. the sensor's word: Corral's sensor resolves its own node's sandbox to the
   episode from the container's labels and sends the workflow id along in
   `output_fields` as ``container.label[corral.workflow_id]`` (Falco's own
   field name for a container label, so a Falco rule that prints it works too);
2. the `SandboxId` search attribute (Keyword, the full 64-hex id) that every
   episode sets: Falco's `container.id` is the first 12 hex digits, so a
   prefix match (``STARTS_WITH``) finds the episode; running ones first.

Answers are cached. Visibility is eventually consistent (an episode's
`SandboxId` shows a moment after its sandbox runs), so a miss is searched
again a few times within a second or two before the intake answers 404.
"""

from __future__ import annotations

import asyncio
import re

from temporalio.client import Client

from contract.labels import OWNER_LABEL
from contract.search_attributes import SANDBOX_ID

WORKFLOW_ID_FIELD = f"container.label[{OWNER_LABEL}]"
_HEX = re.compile(r"^[0-9a-f]{12,64}$")
_CACHE_MAX = 50_000
MISS_RETRIES = 3
MISS_RETRY_DELAY_S = 0.5


class EpisodeDirectory:
    """Container id -> episode workflow id, through Temporal visibility."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self._owners: dict[str, str] = {}

    async def workflow_for(self, container_id: str) -> str | None:
        """The episode whose `SandboxId` starts with `container_id`, or None."""
        if container_id in self._owners:
            return self._owners[container_id]
        if not _HEX.match(container_id):
            return None  # never put untrusted text into a visibility query
        owner = await self._search(container_id)
        for _ in range(MISS_RETRIES):
            if owner is not None:
                break
            await asyncio.sleep(MISS_RETRY_DELAY_S)
            owner = await self._search(container_id)
        if owner is not None:
            if len(self._owners) >= _CACHE_MAX:
                self._owners.clear()
            self._owners[container_id] = owner
        return owner

    async def _search(self, container_id: str) -> str | None:
        query = f'{SANDBOX_ID.name} STARTS_WITH "{container_id}"'
        closed: str | None = None
        async for wf in self._client.list_workflows(query, limit=10):
            if wf.status is not None and wf.status.name == "RUNNING":
                return wf.id
            closed = closed or wf.id
        return closed

    def forget(self, container_id: str) -> None:
        self._owners.pop(container_id, None)
