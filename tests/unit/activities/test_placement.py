"""Placement over the node registry: preferences, budgets and spreading (pure logic)."""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime, timedelta

from temporalio.testing import ActivityEnvironment

from activities.placement import (
    FleetActivities,
    Reservations,
    WaitingLine,
    choose_node,
    fleet_room,
    image_matches,
)
from contract.models import (
    NodeCapacity,
    NodeHeartbeat,
    NodeInfo,
    NodeState,
    NodeUsage,
    PlaceInput,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _node(
    name: str,
    *,
    state: NodeState = "ready",
    images: tuple[str, ...] = (),
    warm: int = 0,
    sandboxes: int = 0,
    memory_mb: int = 0,
    capacity: NodeCapacity | None = None,
) -> NodeInfo:
    beat = NodeHeartbeat(
        name=name,
        task_queue=f"corral-node-{name}",
        version="test",
        capacity=capacity or NodeCapacity(cores=2, memory_mb=8192, pids=10_000, max_sandboxes=100),
        use=NodeUsage(sandboxes=sandboxes, memory_mb=memory_mb),
        images=list(images),
        warm={"corral.local/busybox:latest": warm} if warm else {},
    )
    # Heard from 5 s ago: live, and before any placement a test makes.
    heard = datetime.now(UTC) - timedelta(seconds=5)
    return NodeInfo(heartbeat=beat, state=state, last_seen=heard, joined=NOW)


def _request(**kw: object) -> PlaceInput:
    return PlaceInput.model_validate(
        {"image": "busybox", "cpu_cores": 1, "memory_mb": 512, "pids": 256, **kw}
    )


def _place(nodes: list[NodeInfo], request: PlaceInput | None = None) -> str | None:
    return choose_node(nodes, request or _request(), Reservations(), random.Random(7)).node


def test_short_names_match_the_full_reference() -> None:
    assert image_matches("busybox", "corral.local/busybox:latest")
    assert not image_matches("busybox", "corral.local/debian:latest")
    assert image_matches("localhost:5000/a/b:1", "localhost:5000/a/b:1")


def test_a_warm_sandbox_wins_then_the_image_then_load() -> None:
    warm = _node("warm", warm=1, sandboxes=50)
    holder = _node("holder", images=("corral.local/busybox:latest",), sandboxes=40)
    empty = _node("empty")
    assert _place([empty, holder, warm]) == "warm"
    assert _place([empty, holder]) == "holder"
    assert _place([empty, _node("busy", sandboxes=90)]) == "empty"


def test_lost_draining_and_excluded_nodes_are_never_chosen() -> None:
    nodes = [_node("a", state="lost"), _node("b", state="draining"), _node("c")]
    assert _place(nodes) == "c"
    assert _place(nodes, _request(exclude=["c"])) is None


def test_no_room_says_why_per_node() -> None:
    small = NodeCapacity(cores=1, memory_mb=1024, pids=300, max_sandboxes=1)
    full = _node("full", sandboxes=1, capacity=small)
    tight = _node("tight", memory_mb=1020, capacity=small.model_copy(update={"max_sandboxes": 9}))
    closed = _node("closed", capacity=small.model_copy(update={"max_sandboxes": 9}))
    closed.heartbeat.use.admitting = False
    closed.heartbeat.use.closed = "CPU pressure 97% >= 90%"
    placement = choose_node([full, tight, closed], _request(), Reservations(), random.Random(1))
    assert placement.node is None
    assert placement.reason.startswith("no node with room: ")
    assert "full at its 1 sandboxes" in placement.reason
    assert "tight out of memory budget (1024 MiB)" in placement.reason
    assert "closed not admitting: CPU pressure 97% >= 90%" in placement.reason


def test_nominal_cpu_and_memory_do_not_limit_idle_sandboxes() -> None:
    # 2 cores and 8 GiB: 128 episodes asking 1 core and 512 MiB each all fit,
    # because admission counts what sandboxes use, not their ceilings.
    node = _node("n")
    reservations, rng = Reservations(), random.Random(3)
    placed = [choose_node([node], _request(), reservations, rng).node for _ in range(100)]
    assert placed == ["n"] * 100  # max_sandboxes is 100
    assert choose_node([node], _request(), reservations, rng).node is None


def test_a_burst_spreads_over_equal_nodes() -> None:
    nodes = [_node(f"n{i}") for i in range(3)]
    reservations, rng = Reservations(), random.Random(11)
    counts = Counter(choose_node(nodes, _request(), reservations, rng).node for _ in range(30))
    assert set(counts) == {"n0", "n1", "n2"}
    assert max(counts.values()) - min(counts.values()) <= 2


def test_a_report_newer_than_a_placement_replaces_its_reservation() -> None:
    capacity = NodeCapacity(cores=1, memory_mb=10**6, pids=10**6, max_sandboxes=1)
    reservations, rng = Reservations(), random.Random(5)
    assert choose_node([_node("n", capacity=capacity)], _request(), reservations, rng).node == "n"
    assert choose_node([_node("n", capacity=capacity)], _request(), reservations, rng).node is None
    # The node reported after that placement: its own count now says what it holds.
    later = _node("n", capacity=capacity).model_copy(update={"last_seen": datetime.now(UTC)})
    assert choose_node([later], _request(), reservations, rng).node == "n"


def test_a_silent_node_gets_no_episode_before_it_is_marked_lost() -> None:
    silent = _node("quiet").model_copy(
        update={"last_seen": datetime.now(UTC) - timedelta(seconds=16)}
    )
    placement = choose_node([silent], _request(), Reservations(), random.Random(2))
    assert placement.node is None and "quiet silent" in placement.reason


def test_a_present_node_is_placed_on_however_long_since_its_last_signal() -> None:
    """Nodes signal only on news; their presence activity says they are alive."""
    quiet = _node("quiet").model_copy(
        update={"last_seen": datetime.now(UTC) - timedelta(hours=1), "present": True}
    )
    assert choose_node([quiet], _request(), Reservations(), random.Random(2)).node == "quiet"


def test_a_node_whose_presence_ended_gets_no_episode() -> None:
    """Its worker stopped: it is lost unless it comes back, so nothing waits on it."""
    stopped = _node("gone").model_copy(update={"present": False})
    placement = choose_node([stopped], _request(), Reservations(), random.Random(2))
    assert placement.node is None and "gone not present" in placement.reason


async def test_a_cold_view_reads_the_registry_before_anyone_waits() -> None:
    """Right after `corral up` the workflow worker's view may not hold the node
    that just joined: placement reads the registry then, instead of putting the
    first episodes of a burst in line (and every later one behind them)."""
    node, view = _node("n"), list[NodeInfo]()
    reads = 0

    async def read_registry() -> list[NodeInfo]:
        nonlocal reads
        reads += 1
        view.append(node)
        return view

    fleet = FleetActivities(lambda: view, nodes_when_empty=read_registry)
    first = await ActivityEnvironment().run(fleet.place, _request())
    second = await ActivityEnvironment().run(fleet.place, _request())
    assert (first.node, second.node, reads) == ("n", "n", 1)


def _fleet(node: NodeInfo) -> FleetActivities:
    return FleetActivities(lambda: [node])


def test_waiting_episodes_are_served_in_arrival_order() -> None:
    capacity = NodeCapacity(cores=2, memory_mb=10**6, pids=10**6, max_sandboxes=2)
    full = _node("n", sandboxes=2, capacity=capacity)
    fleet = _fleet(full)
    first = fleet.place_in_order("wf-a", _request())
    second = fleet.place_in_order("wf-b", _request())
    assert (first.node, first.position) == (None, 1)
    assert (second.node, second.position) == (None, 2)
    assert "1st in line" in first.reason and "2nd in line" in second.reason
    # One sandbox frees: a newcomer does not take it from those waiting.
    fleet._nodes = lambda: [_node("n", sandboxes=1, capacity=capacity)]
    newcomer = fleet.place_in_order("wf-c", _request())
    assert newcomer.node is None and newcomer.position == 3
    assert "2 ahead" in newcomer.reason
    # The second waiter still waits behind the first; the first gets the room.
    assert fleet.place_in_order("wf-b", _request()).position == 2
    assert fleet.place_in_order("wf-a", _request()).node == "n"
    assert fleet.place_in_order("wf-b", _request()).position == 1


def test_a_waiter_that_stops_asking_leaves_the_line() -> None:
    line = WaitingLine()
    assert line.wait("gone") == 1 and line.wait("stays") == 2
    line.asked["gone"] -= 60  # last asked a minute ago
    assert line.ahead_of("stays") == 0
    assert line.wait("stays") == 1


def test_fleet_room_counts_free_slots_over_admitting_nodes() -> None:
    capacity = NodeCapacity(cores=2, memory_mb=10**6, pids=10**6, max_sandboxes=10)
    open_node = _node("a", sandboxes=4, capacity=capacity)
    closed = _node("b", capacity=capacity)
    closed.heartbeat.use.admitting = False
    reservations = Reservations()
    assert fleet_room([open_node, closed], reservations) == 6
    reservations.add("a", _request())
    assert fleet_room([open_node, closed], reservations) == 5


def test_a_burst_does_not_herd_onto_the_host_sampled_quietest() -> None:
    # Two nodes on one host whose load1 was read at different moments.
    busy, quiet = _node("busy"), _node("quiet")
    busy.heartbeat.load1, quiet.heartbeat.load1 = 6.0, 3.0
    reservations, rng = Reservations(), random.Random(13)
    nodes = [busy, quiet]
    counts = Counter(choose_node(nodes, _request(), reservations, rng).node for _ in range(16))
    assert counts["busy"] >= 4 and counts["quiet"] > counts["busy"]


def test_a_node_heard_lost_gets_no_episode_before_the_directory_shows_it() -> None:
    """The registry's `node_lost` runs on the placing worker: it stops choosing
    the node at once, not when its cached view next asks that shard."""
    fleet = FleetActivities(lambda: [_node("dead")])
    fleet.heard_lost("dead")
    assert fleet.place_in_order("ep", _request()).node is None
