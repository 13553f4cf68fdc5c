"""ShimGroups' bookkeeping: fill by tenant, never join a group mid-create or a
closed one, adopt what a previous worker made."""

from __future__ import annotations

import pytest

from sandbox.shimgroups import ShimGroups


def test_fills_the_fullest_open_group_of_the_tenant_up_to_its_size() -> None:
    groups = ShimGroups(size=3)
    first = groups.join("s1", "a")
    groups.created("s1")
    assert groups.join("s2", "a") == first
    groups.created("s2")
    assert groups.join("s3", "a") == first
    groups.created("s3")
    fourth = groups.join("s4", "a")  # full: a new shim
    assert fourth != first and groups.sizes() == {first: 3, fourth: 1}


def test_tenants_never_share_and_the_key_is_in_the_name() -> None:
    groups = ShimGroups(size=5)
    a = groups.join("s1", "Team A")
    groups.created("s1")
    b = groups.join("s2", "team-b")
    assert a != b and a.startswith("corral-team-a-") and b.startswith("corral-team-b-")


def test_a_group_with_a_create_in_flight_is_not_joined() -> None:
    groups = ShimGroups(size=5)
    first = groups.join("s1", "a")  # not created yet: the shim holds its lock
    second = groups.join("s2", "a")
    assert second != first
    groups.created("s1")
    assert groups.join("s3", "a") == first  # second still creating: not joined
    assert groups.group_of("s3") == first


def test_a_group_whose_last_member_left_is_closed_for_good() -> None:
    groups = ShimGroups(size=5)
    first = groups.join("s1", "a")
    groups.created("s1")
    groups.leave("s1")
    assert first not in groups.sizes()
    assert groups.join("s2", "a") != first


def test_a_failed_create_leaves_and_frees_its_group() -> None:
    groups = ShimGroups(size=5)
    first = groups.join("s1", "a")
    groups.created("s1")
    groups.join("s2", "a")
    groups.leave("s2")  # rolled back
    groups.created("s2")
    assert groups.sizes() == {first: 1}
    assert groups.join("s3", "a") == first


def test_adopted_sandboxes_count_and_repeated_joins_are_stable() -> None:
    groups = ShimGroups(size=2)
    groups.adopt("old1", "corral-a-1234", "a")
    assert groups.join("s1", "a") == "corral-a-1234"
    assert groups.join("s1", "a") == "corral-a-1234"  # the same sandbox again
    groups.created("s1")
    assert groups.join("s2", "a") != "corral-a-1234"  # full at 2


def test_size_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        ShimGroups(size=0)
