"""The workflow worker's copy of the node registry, refreshed in the background.

Placement (`activities/placement.py`) reads it for every episode; one query
a second to the registry workflow keeps it fresh, whatever the episode rate.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from temporalio.client import Client

from activities.models import NodeInfo
from workflows.nodes import list_nodes

REFRESH_EVERY_S = 1.0
log = logging.getLogger(__name__)


class NodeDirectory:
    def __init__(self, client: Client) -> None:
        self._client = client
        self._nodes: list[NodeInfo] = []

    def nodes(self) -> list[NodeInfo]:
        return self._nodes

    async def refresh(self) -> None:
        self._nodes = await list_nodes(self._client)

    async def refresh_forever(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.refresh()
            except Exception as err:  # keep the last view; say why once per failure
                log.warning("node registry not readable: %s", err)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=REFRESH_EVERY_S)
