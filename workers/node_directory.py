"""The workflow worker's copy of the node registry, refreshed in the background.

Placement (`activities/placement.py`) reads it for every episode; one query
a second to each registry shard that holds nodes keeps it fresh, whatever the
episode rate. Shards that hold none are looked for every third second with
one visibility query (`running_shards`), not one failed query each. A
shard that does not answer (busy: its query buffer is full) keeps its last
view; the others are still refreshed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from temporalio.client import Client

from contract.models import NodeInfo
from workflows.nodes import REGISTRY_SHARDS, merge_shards, running_shards, shard_nodes

REFRESH_EVERY_S = 1.0
# Shards no node has joined are asked only this often: a query costs the
# server and the workflow worker a few ms each, and small fleets leave most
# of the 32 shards empty.
EMPTY_SHARDS_EVERY = 3
log = logging.getLogger(__name__)


class NodeDirectory:
    def __init__(self, client: Client) -> None:
        self._client = client
        self._nodes: list[NodeInfo] = []
        self._shards: list[list[NodeInfo]] = [[] for _ in range(REGISTRY_SHARDS)]
        self._refreshes = 0
        self._cold = asyncio.Lock()

    def nodes(self) -> list[NodeInfo]:
        return self._nodes

    async def nodes_when_empty(self) -> list[NodeInfo]:
        """The nodes, asking every shard first if the view holds none: a node that
        joined just before a burst (right after `corral up`) is placed on at once
        instead of after the next background refresh, and a burst's placements
        share that one refresh."""
        async with self._cold:
            if not self._nodes:
                with contextlib.suppress(Exception):  # the background loop says why
                    await self.refresh(everything=True)
        return self._nodes

    async def refresh(self, everything: bool = False) -> None:
        """Ask the shards that hold nodes; `everything`: every shard (a cold view)."""
        look_for_new = self._refreshes % EMPTY_SHARDS_EVERY == 0
        self._refreshes += 1
        asked = {k for k in range(REGISTRY_SHARDS) if everything or self._shards[k]}
        if look_for_new and not everything:
            asked |= await self._running_shards()
        order = sorted(asked)
        answers = await asyncio.gather(
            *(shard_nodes(self._client, k) for k in order), return_exceptions=True
        )
        failed = [err for err in answers if isinstance(err, BaseException)]
        for shard, answer in zip(order, answers, strict=True):
            if not isinstance(answer, BaseException):
                self._shards[shard] = answer
        self._nodes = merge_shards(self._shards)
        if failed:
            raise failed[0]  # said once per refresh by refresh_forever

    async def _running_shards(self) -> set[int]:
        """The shards whose workflow runs; every shard when visibility does not answer."""
        try:
            return await running_shards(self._client)
        except Exception as err:
            log.warning("node registry shards not listed (asking each): %s", err)
            return set(range(REGISTRY_SHARDS))

    async def refresh_forever(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.refresh()
            except Exception as err:  # keep the last view; say why once per failure
                log.warning("node registry not readable: %s", err)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=REFRESH_EVERY_S)
