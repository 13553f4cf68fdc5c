"""The snapshot collector's decision (sandbox/snapshot_gc.py): a pure function over
image records, the containers' images and the time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from google.protobuf import timestamp_pb2

from contract.labels import BASE_IMAGE_LABEL, LAST_USED_LABEL
from sandbox._gen.containerd.api.services.images.v1 import images_pb2
from sandbox.snapshot_gc import ImageRecord, collectable, image_record, is_candidate

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
HOUR = 3600.0
SNAP = "corral.local/corral/snapshots"


def rec(name: str, age_s: float, base: str = "") -> ImageRecord:
    return ImageRecord(name=name, touched=NOW - timedelta(seconds=age_s), base_image=base)


def test_only_old_unused_local_snapshots_go() -> None:
    images = [
        rec(f"{SNAP}/ep-1:old", 2 * HOUR),
        rec(f"{SNAP}/ep-1:young", 60),
        rec(f"{SNAP}/ep-1:used", 2 * HOUR),
        rec("corral.local/busybox:latest", 10 * HOUR),  # not a snapshot
        rec("localhost:5000/corral/snapshots/ep-1:old", 10 * HOUR),  # another registry's
        rec("corral.local/corral/snapshotsx/ep:s1", 10 * HOUR),  # only the repository itself
    ]
    # Containers may name their image short or in full.
    in_use = {"corral/snapshots/ep-1:used"}
    assert collectable(images, in_use, NOW, HOUR) == [f"{SNAP}/ep-1:old"]


def test_age_is_measured_against_the_retention() -> None:
    images = [rec(f"{SNAP}/ep:a", 100), rec(f"{SNAP}/ep:b", 99)]
    assert collectable(images, set(), NOW, 99.5) == [f"{SNAP}/ep:a"]
    assert collectable(images, set(), NOW, 1000) == []


def test_zero_retention_never_collects() -> None:
    images = [rec(f"{SNAP}/ep:a", 100 * HOUR)]
    assert collectable(images, set(), NOW, 0) == []


def test_hibernation_snapshots_are_left_to_their_episode() -> None:
    images = [rec(f"{SNAP}/ep:hibernate-3", 10 * HOUR), rec(f"{SNAP}/ep:s1", 10 * HOUR)]
    assert collectable(images, set(), NOW, HOUR) == [f"{SNAP}/ep:s1"]


def test_the_lineage_of_a_kept_image_stays() -> None:
    """grandparent <- parent <- child (in use); an unrelated old one goes; a chain
    whose tip is unused goes whole."""
    images = [
        rec(f"{SNAP}/ep:grandparent", 9 * HOUR, base="corral.local/busybox:latest"),
        rec(f"{SNAP}/ep:parent", 8 * HOUR, base=f"{SNAP}/ep:grandparent"),
        rec(f"{SNAP}/child:s1", 7 * HOUR, base=f"{SNAP}/ep:parent"),
        rec(f"{SNAP}/other:s1", 9 * HOUR, base="corral.local/busybox:latest"),
        rec(f"{SNAP}/other:s2", 8 * HOUR, base=f"{SNAP}/other:s1"),
        rec("corral.local/busybox:latest", 99 * HOUR),
    ]
    in_use = {f"{SNAP}/child:s1"}
    assert collectable(images, in_use, NOW, HOUR) == [f"{SNAP}/other:s1", f"{SNAP}/other:s2"]
    # A young child keeps its old parents just the same, and so does a hibernation.
    young = [*images[:2], rec(f"{SNAP}/child:s1", 5, base=f"{SNAP}/ep:parent")]
    assert collectable(young, set(), NOW, HOUR) == []
    sleeping = [*images[:2], rec(f"{SNAP}/child:hibernate-1", 9 * HOUR, base=f"{SNAP}/ep:parent")]
    assert collectable(sleeping, set(), NOW, HOUR) == []


def test_an_image_outside_the_repository_keeps_the_snapshot_it_was_made_from() -> None:
    images = [
        rec(f"{SNAP}/ep:s1", 9 * HOUR),
        rec("localhost:5000/corral/snapshots/ep:s2", 9 * HOUR, base=f"{SNAP}/ep:s1"),
    ]
    assert collectable(images, set(), NOW, HOUR) == []


def test_a_base_missing_from_the_node_or_a_cycle_does_not_break_the_walk() -> None:
    images = [
        rec(f"{SNAP}/a:s1", 9 * HOUR, base=f"{SNAP}/gone:s1"),
        rec(f"{SNAP}/b:s1", 9 * HOUR, base=f"{SNAP}/c:s1"),
        rec(f"{SNAP}/c:s1", 9 * HOUR, base=f"{SNAP}/b:s1"),
    ]
    assert collectable(images, {f"{SNAP}/b:s1"}, NOW, HOUR) == [f"{SNAP}/a:s1"]


def test_candidates_are_local_snapshots_but_hibernations() -> None:
    assert is_candidate(f"{SNAP}/ep-1:s1")
    assert is_candidate(f"{SNAP}/ep-1:hibernated")  # a user's name, not the episode's
    assert not is_candidate(f"{SNAP}/ep-1:hibernate-2")
    assert not is_candidate("corral.local/busybox:latest")
    assert not is_candidate("registry.lan:5000/corral/snapshots/ep:s1")


def _stamp(moment: datetime) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(moment)
    return stamp


def test_an_image_is_as_old_as_its_latest_write_or_use() -> None:
    created, updated = NOW - timedelta(hours=5), NOW - timedelta(hours=3)
    image = images_pb2.Image(
        name=f"{SNAP}/ep:s1",
        labels={BASE_IMAGE_LABEL: "corral.local/busybox:latest"},
        created_at=_stamp(created),
        updated_at=_stamp(updated),
    )
    record = image_record(image)
    assert record.touched == updated
    assert record.base_image == "corral.local/busybox:latest"
    used = int((NOW - timedelta(minutes=5)).timestamp())
    image.labels[LAST_USED_LABEL] = str(used)
    assert image_record(image).touched == datetime.fromtimestamp(used, UTC)
    assert image_record(images_pb2.Image(name="x")).touched == datetime.fromtimestamp(0, UTC)
