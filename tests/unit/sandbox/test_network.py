"""Pure parts of sandbox.network: the model, allocation, the table file, the nft scripts."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from pydantic import ValidationError

from contract.errors import NetworkError
from sandbox.network import (
    RESERVED_RANGE,
    SANDBOX_RANGE,
    SLOT_COUNT,
    EgressRule,
    NetworkAttachment,
    allocate_slot,
    host_ifname,
    load_table,
    preferred_slot,
    render_base_table,
    render_cut,
    render_sandbox_removal,
    render_sandbox_rules,
    save_table,
    slot_addresses,
)

T = "inet corral"


def attachment(
    slot: int = 7, egress: list[EgressRule] | None = None, cut: bool = False
) -> NetworkAttachment:
    host, sb = slot_addresses(slot)
    return NetworkAttachment(
        sandbox_id=f"sb-{slot}",
        pid=100 + slot,
        netns_inode=4026532000,
        slot=slot,
        host_ifname=host_ifname(slot),
        host_address=host,
        sandbox_address=sb,
        egress=egress or [],
        cut=cut,
    )


def test_egress_rule_validation() -> None:
    assert EgressRule(cidr="198.19.255.1/32", port=80).protocol == "tcp"
    assert EgressRule(cidr="8.8.8.0/24", port=None, protocol="udp").cidr == "8.8.8.0/24"
    assert EgressRule(cidr="10.0.0.1", port=None).cidr == "10.0.0.1/32"
    for bad in (
        {"cidr": "10.0.0.1/24", "port": 1},
        {"cidr": "nonsense", "port": 1},
        {"cidr": "fd00::/64", "port": 1},
        {"cidr": "10.0.0.0/8"},
        {"cidr": "10.0.0.0/8", "port": 0},
        {"cidr": "10.0.0.0/8", "port": 70000},
        {"cidr": "10.0.0.0/8", "port": 1, "protocol": "icmp"},
        {"cidr": "10.0.0.0/8", "port": 1, "x": 1},
    ):
        with pytest.raises(ValidationError):
            EgressRule.model_validate(bad)


def test_slots_are_31s_inside_the_range_and_outside_the_reserved_block() -> None:
    assert slot_addresses(0) == ("198.18.0.0", "198.18.0.1")
    assert slot_addresses(1) == ("198.18.0.2", "198.18.0.3")
    last = slot_addresses(SLOT_COUNT - 1)
    assert all(ipaddress.ip_address(a) in SANDBOX_RANGE for a in last)
    assert not any(ipaddress.ip_address(a) in RESERVED_RANGE for a in last)
    assert ipaddress.ip_address(last[1]) + 1 == RESERVED_RANGE.network_address
    with pytest.raises(ValueError):
        slot_addresses(SLOT_COUNT)
    assert len(host_ifname(SLOT_COUNT - 1)) <= 15  # IFNAMSIZ


def test_allocation_is_deterministic_and_probes_past_collisions() -> None:
    first = allocate_slot("episode-a", set(), set(), set())
    assert first == preferred_slot("episode-a") == allocate_slot("episode-a", set(), set(), set())
    assert allocate_slot("episode-a", {first}, set(), set()) == (first + 1) % SLOT_COUNT
    assert allocate_slot("episode-a", set(), {host_ifname(first)}, set()) == first + 1
    busy_addr = slot_addresses(first)[1]
    assert allocate_slot("episode-a", set(), set(), {busy_addr}) == first + 1


def test_allocation_many_ids_no_collision() -> None:
    taken: set[int] = set()
    for i in range(3000):
        taken.add(allocate_slot(f"episode-{i}", taken, set(), set()))
    assert len(taken) == 3000


def test_allocation_exhausted() -> None:
    with pytest.raises(NetworkError, match="no free address slot"):
        allocate_slot("x", set(range(SLOT_COUNT)), set(), set())


def test_table_round_trip(tmp_path: Path) -> None:
    assert load_table(tmp_path) == {}
    att = attachment(egress=[EgressRule(cidr="198.19.255.1/32", port=7001)], cut=True)
    save_table(tmp_path, {att.sandbox_id: att})
    assert load_table(tmp_path) == {att.sandbox_id: att}
    (tmp_path / "network" / "attachments.json").write_text("{not json")
    with pytest.raises(NetworkError, match="unreadable"):
        load_table(tmp_path)


def test_base_table_guards() -> None:
    base = render_base_table()
    assert "table inet corral" in base
    assert 'meta oifkind != "veth" drop' in base  # nothing is routed off this machine
    assert "ip saddr 198.18.0.0/15 ct state new drop" in base
    assert "masquerade" not in base and "nat" not in base
    assert base.count("iifname vmap @egress") == 2  # input and forward share sandbox chains


def test_sandbox_rules_render() -> None:
    att = attachment(
        egress=[
            EgressRule(cidr="198.19.255.1/32", port=7001),
            EgressRule(cidr="198.19.255.0/31", port=None, protocol="udp"),
        ]
    )
    script = render_sandbox_rules(att)
    lines = script.splitlines()
    assert lines[:2] == ["add chain inet corral sb7", "flush chain inet corral sb7"]
    assert "add rule inet corral sb7 ip saddr != 198.18.0.15 drop" in lines
    assert "add rule inet corral sb7 ip daddr 198.19.255.1/32 tcp dport 7001 accept" in lines
    assert "add rule inet corral sb7 ip daddr 198.19.255.0/31 meta l4proto udp accept" in lines
    assert lines.index("add rule inet corral sb7 drop") > lines.index(
        "add rule inet corral sb7 ip daddr 198.19.255.1/32 tcp dport 7001 accept"
    )
    assert 'add element inet corral egress { "crl7" : jump sb7 }' in lines
    assert lines[-1] == 'delete element inet corral cut { "crl7" }'
    assert (
        render_sandbox_rules(attachment(cut=True)).splitlines()[-1]
        == 'add element inet corral cut { "crl7" }'
    )


def test_removal_and_cut_scripts_are_absence_tolerant() -> None:
    lines = render_sandbox_removal(7).splitlines()
    for kind in ("egress", "sandbox_ifs", "cut"):
        adds = [i for i, ln in enumerate(lines) if ln.startswith(f"add element {T} {kind}")]
        dels = [i for i, ln in enumerate(lines) if ln.startswith(f"delete element {T} {kind}")]
        assert adds and dels and adds[0] < dels[0]
    assert lines[-1] == "delete chain inet corral sb7"
    assert render_cut(7, True) == 'add element inet corral cut { "crl7" }\n'
    assert render_cut(7, False).splitlines()[-1] == 'delete element inet corral cut { "crl7" }'
