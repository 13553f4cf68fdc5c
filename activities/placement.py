"""Placement: which node an episode goes to, read from the node registry.

`place` runs as a local activity on the workflow worker: it reads the worker's
cached copy of the registry (`workers/node_directory.py` refreshes it), so an
episode is placed without a round trip to any node and without a task on the
server's queues. Its answer is recorded in the episode's history as a marker,
so replay never asks again.

Order of preference: a node with a ready warm sandbox of the image, then a node
that holds the image, then any node with room; within a tier, the less loaded
of two random nodes (power of two choices) spreads load without herding.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from temporalio import activity
from temporalio.client import Client
from temporalio.service import RPCError

from activities.capacity import IDLE_SANDBOX_MB, THREADS_PER_IDLE_SANDBOX, free_slots
from activities.records import record_episode
from contract.ids import resolve_image_name
from contract.models import (
    NodeInfo,
    NodeLostInput,
    PlaceInput,
    Placement,
    RecordEpisodeInput,
)
from observability.metrics import Metrics
from observability.records import RecordWriter

NODE_LOST_SIGNAL = "node_lost"
# A node listed by a registry of before presence (workflows/nodes.py) and not
# heard from for this long gets no new episode (keep-alives every 10 s).
SILENT_AFTER_S = 15.0
# A placement counts against its node until a heartbeat newer than it (which
# counts the sandbox itself), and at most this long.
RESERVATION_TTL_S = 15.0
# A waiting episode asks again every 2 s (workflows/episode_support.py PLACE_RETRY_S);
# one silent for this long has ended or gone elsewhere and leaves the line.
WAITER_STALE_S = 10.0
# A node this worker was just told is lost (it runs `corral.node_lost`) is skipped
# this long: longer than its directory takes to see the verdict (a second or two).
HEARD_LOST_S = 10.0


@dataclass
class _Reservation:
    made: float  # wall clock, comparable with the registry's last_seen
    expires: float
    image: str


@dataclass
class Reservations:
    """Placements made since the nodes last reported, so that a burst of
    episodes does not all land on the node that looked emptiest."""

    by_node: dict[str, list[_Reservation]] = field(default_factory=dict)

    def add(self, node: str, request: PlaceInput) -> None:
        self.by_node.setdefault(node, []).append(
            _Reservation(time.time(), time.monotonic() + RESERVATION_TTL_S, request.image)
        )

    def of(self, node: str, reported_at: float = 0.0) -> list[_Reservation]:
        """The node's reservations its last report (at `reported_at`) cannot show yet."""
        now = time.monotonic()
        live = [r for r in self.by_node.get(node, []) if r.expires > now and r.made >= reported_at]
        self.by_node[node] = live
        return live


@dataclass
class WaitingLine:
    """Episodes no node had room for, in the order they first asked.

    A waiting episode asks again every few seconds; one that has stopped asking
    (it ended, or was placed by another worker) leaves the line. A request is
    placed only when the fleet has room for everyone ahead of it too, so a
    newcomer never takes the room that frees up for an episode already waiting.
    """

    asked: OrderedDict[str, float] = field(default_factory=OrderedDict)  # id -> last ask

    def ahead_of(self, waiter: str) -> int:
        """How many live waiters asked before `waiter` (all of them for a newcomer)."""
        now = time.monotonic()
        for stale in [w for w, at in self.asked.items() if now - at > WAITER_STALE_S]:
            del self.asked[stale]
        return list(self.asked).index(waiter) if waiter in self.asked else len(self.asked)

    def wait(self, waiter: str) -> int:
        """Keep `waiter`'s place (or give it the last one); its position, 1 = next."""
        position = self.ahead_of(waiter) + 1
        self.asked[waiter] = time.monotonic()
        return position

    def leave(self, waiter: str) -> None:
        self.asked.pop(waiter, None)


def image_matches(wanted: str, held: str) -> bool:
    """`busybox` matches `corral.local/busybox:latest`: both name one image."""
    return resolve_image_name(wanted) == resolve_image_name(held)


def room_problem(node: NodeInfo, reserved: list[_Reservation]) -> str | None:
    """Why the node cannot take an episode now, or None when it can: what it
    measured (activities/capacity.py) plus what was placed since it reported."""
    if node.state != "ready":
        return node.state
    # Its presence ended: its worker stopped (or it went quiet), and it is lost
    # unless it beats again soon; placed on now, an episode would wait for that.
    if node.present is False:
        return "not present"
    # A present node signals only on news, so its silence says nothing; one a
    # registry of before presence lists is silent past a keep-alive and a half:
    # on its way to lost.
    if node.present is None and time.time() - node.last_seen.timestamp() > SILENT_AFTER_S:
        return "silent"
    cap, use = node.heartbeat.capacity, node.heartbeat.use
    if not use.admitting:
        return f"not admitting: {use.closed}"
    if use.sandboxes + len(reserved) + 1 > cap.max_sandboxes:
        return f"at its {cap.max_sandboxes} sandboxes"
    if use.memory_mb + (len(reserved) + 1) * IDLE_SANDBOX_MB > cap.memory_mb:
        return f"out of memory budget ({cap.memory_mb} MiB)"
    if use.pids + (len(reserved) + 1) * THREADS_PER_IDLE_SANDBOX > cap.pids:
        return f"out of pids budget ({cap.pids})"
    return None


def fleet_room(nodes: list[NodeInfo], reservations: Reservations) -> int:
    """How many more sandboxes the fleet can take now, over its ready nodes."""
    room = 0
    for node in nodes:
        reserved = reservations.of(node.name, node.last_seen.timestamp())
        if room_problem(node, reserved) is None:
            beat = node.heartbeat
            room += free_slots(beat.capacity, beat.use, len(reserved))
    return room


def _load(node: NodeInfo, reserved: list[_Reservation]) -> float:
    """The node's sandboxes (placements since its report included) weighted by
    how busy its host is. The count is a factor, not a share of a budget of
    thousands: each placement must tip the next choice, or a burst herds onto
    the node whose host load happened to be sampled lowest."""
    cap, use = node.heartbeat.capacity, node.heartbeat.use
    memory = (use.memory_mb + len(reserved) * IDLE_SANDBOX_MB) / max(cap.memory_mb, 1)
    host = 1 + node.heartbeat.load1 / max(cap.cores, 1.0) + memory
    return (use.sandboxes + len(reserved) + 1) * host


def _tier(node: NodeInfo, request: PlaceInput, reserved: list[_Reservation]) -> int:
    """0: a warm sandbox of the image is ready; 1: the image is there; 2: neither."""
    beat = node.heartbeat
    warm = sum(n for image, n in beat.warm.items() if image_matches(request.image, image))
    if warm > sum(1 for r in reserved if r.image == request.image):
        return 0
    if any(image_matches(request.image, held) for held in beat.images):
        return 1
    return 2


def choose_node(
    nodes: list[NodeInfo],
    request: PlaceInput,
    reservations: Reservations,
    rng: random.Random,
) -> Placement:
    problems: list[str] = []
    fitting: list[tuple[int, float, NodeInfo]] = []
    for node in nodes:
        if node.name in request.exclude:
            problems.append(f"{node.name} lost")
            continue
        reserved = reservations.of(node.name, node.last_seen.timestamp())
        problem = room_problem(node, reserved)
        if problem is not None:
            problems.append(f"{node.name} {problem}")
            continue
        fitting.append((_tier(node, request, reserved), _load(node, reserved), node))
    if not fitting:
        why = "; ".join(problems) if problems else "no node has joined"
        return Placement(node=None, reason=f"no node with room: {why}")
    best = min(tier for tier, _, _ in fitting)
    tier = [(load, node) for t, load, node in fitting if t == best]
    pair = rng.sample(tier, 2) if len(tier) > 2 else tier
    chosen = min(pair, key=lambda candidate: candidate[0])[1]
    reservations.add(chosen.name, request)
    return Placement(node=chosen.name)


class FleetActivities:
    """The control role's activities, run by the workflow worker: placement over
    its cached registry, telling episodes that their node is lost, and the
    records of episodes that had no teardown to write them."""

    def __init__(
        self,
        nodes: Callable[[], list[NodeInfo]],
        temporal: Client | None = None,
        *,
        nodes_when_empty: Callable[[], Awaitable[list[NodeInfo]]] | None = None,
        records: RecordWriter | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self._nodes = nodes
        self._nodes_when_empty = nodes_when_empty
        self._temporal = temporal
        self._records = records
        self._metrics = metrics
        self._reservations = Reservations()
        self._line = WaitingLine()
        self._rng = random.Random()
        self._heard_lost: dict[str, float] = {}  # node -> monotonic, when told

    def heard_lost(self, node: str) -> None:
        """Placement stops choosing `node` now, not when the directory next asks
        its shard: episodes started right after a loss must not go there."""
        self._heard_lost[node] = time.monotonic()

    def _live_view(self) -> list[NodeInfo]:
        now = time.monotonic()
        for node in [n for n, at in self._heard_lost.items() if now - at > HEARD_LOST_S]:
            del self._heard_lost[node]
        return [n for n in self._nodes() if n.name not in self._heard_lost]

    @activity.defn(name="corral.place")
    async def place(self, request: PlaceInput) -> Placement:
        if not self._nodes() and self._nodes_when_empty is not None:
            # A cold view (the worker just started, the fleet just joined) is no
            # reason to put a burst in line: read the registry now.
            await self._nodes_when_empty()
        return self.place_in_order(activity.info().workflow_id or "", request)

    def place_in_order(self, waiter: str, request: PlaceInput) -> Placement:
        """A node for `waiter`'s episode, unless the fleet's room is all needed by
        the episodes that asked before it: then its place in the line."""
        nodes = self._live_view()
        ahead = self._line.ahead_of(waiter)
        if ahead and ahead >= fleet_room(nodes, self._reservations):
            position = self._line.wait(waiter)
            return Placement(
                node=None,
                reason=f"waiting for room: {_ordinal(position)} in line ({ahead} ahead)",
                position=position,
            )
        placement = choose_node(nodes, request, self._reservations, self._rng)
        if placement.node is not None:
            self._line.leave(waiter)
            return placement
        position = self._line.wait(waiter)
        placement.reason = f"{_ordinal(position)} in line; {placement.reason}"
        placement.position = position
        return placement

    @activity.defn(name="corral.record_episode")
    async def record_episode(self, input: RecordEpisodeInput) -> None:
        """Records of an episode with no teardown to ride on (lean run, lost node)."""
        record_episode(input, self._records, self._metrics)

    @activity.defn(name="corral.live_nodes")
    async def live_nodes(self) -> list[str]:
        """The nodes that are there (ready or draining): the janitor's round."""
        return [node.name for node in self._nodes() if node.state != "lost"]

    @activity.defn(name="corral.node_lost")
    async def node_lost(self, input: NodeLostInput) -> int:
        """Signal `node_lost` to every open episode that may be on the node.

        Running episodes carry `SandboxNode`; those still provisioning do not
        (that state is not written to visibility), so they are told too and
        each ignores a node that is not its own. Returns how many were told.
        """
        self.heard_lost(input.node)
        if self._temporal is None:
            raise RuntimeError("node_lost needs a Temporal client")
        query = (
            "WorkflowType = 'EpisodeWorkflow' AND ExecutionStatus = 'Running' AND "
            f"(SandboxNode = '{input.node}' OR EpisodeState = 'provisioning')"
        )
        told = 0
        async for execution in self._temporal.list_workflows(query):
            handle = self._temporal.get_workflow_handle(execution.id)
            with contextlib.suppress(RPCError):  # it ended meanwhile
                await handle.signal(NODE_LOST_SIGNAL, input)
                told += 1
            activity.heartbeat(told)
        return told


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
