"""A node's presence: the activity its registry shard keeps running on the node.

The registry (`workflows/nodes.py`) schedules `corral.presence` on the node's
own queue with a heartbeat timeout; the node worker runs it and heartbeats
until it is cancelled. An activity heartbeat writes no history event and
wakes no workflow, so liveness costs the server a small write every
`HEARTBEAT_THROTTLE` (12.5 s, the node worker's heartbeat throttle) per node
instead of a signal and a workflow task every 10 s; a node that dies stops heartbeating and the
server's timeout tells the registry.

A cancel is never the node's death: the registry cancels presence it armed
again (a restarted worker, `forget`), and a registry run that continued as
new abandons its presence activities (their next heartbeat is refused), the
new run having armed fresh ones. While none runs the node's beat loop sends
keep-alive signals (`BeatGate`), so a registry that lost track hears of it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta

from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from contract.models import NodeRef

PRESENCE_ACTIVITY = "corral.presence"
# How often the activity offers a heartbeat; the SDK sends the latest at most
# every 0.8 x the registry's 25 s timeout (20 s), or this throttle if shorter.
PRESENCE_BEAT_S = 5.0
# The node worker's heartbeat throttle: one sent every 12.5 s leaves 12.5 s of
# the 25 s timeout for a late RPC on a busy server (at 20 s, only 5 s would be
# left: a slow server would lose live nodes). Episode activities (15 s timeout,
# 12 s throttle) are not affected.
HEARTBEAT_THROTTLE = timedelta(seconds=12.5)


class Presence:
    """The node side of presence; `armed` tells the beat loop whether its
    keep-alive signals are needed."""

    def __init__(
        self, silenced: Callable[[], bool] = lambda: False, every_s: float = PRESENCE_BEAT_S
    ) -> None:
        self._running = 0  # two for a moment after the registry continued as new
        self._silenced = silenced  # the sim's partition: heartbeats do not get out
        self._every_s = every_s

    @property
    def armed(self) -> bool:
        return self._running > 0

    def activities(self) -> list[Callable[..., object]]:
        return [self.presence]

    @activity.defn(name=PRESENCE_ACTIVITY)
    async def presence(self, node: NodeRef) -> None:
        self._running += 1
        try:
            while True:
                if not self._silenced():
                    activity.heartbeat()
                await asyncio.sleep(self._every_s)
        except asyncio.CancelledError:
            if activity.is_worker_shutdown():
                # Said at once, so the registry starts its clock now: the node is
                # lost only if no worker of it beats again within the timeout.
                raise ApplicationError(
                    f"node worker of {node.name} stopping",
                    type="NodeStopping",
                    non_retryable=True,
                    category=ApplicationErrorCategory.BENIGN,  # expected: logged at debug
                ) from None
            raise  # cancelled by the registry, or its run ended: armed elsewhere
        finally:
            self._running -= 1
