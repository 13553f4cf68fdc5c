"""User-namespace mapping, opt-out gate, blkio and tc rendering, the id shifter (no services)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from pydantic import ValidationError

from contract.errors import InvalidSpec
from sandbox.models import SandboxSpec
from sandbox.network import tbf_qdisc
from sandbox.spec import MIB, build_oci_spec
from sandbox.userns import (
    IdMapping,
    UidPool,
    check_opt_out,
    host_owner,
    range_for_tenant,
    shift_tree,
)


def spec(**fields: object) -> SandboxSpec:
    return SandboxSpec.model_validate({"image": "busybox", **fields})


def test_user_namespace_maps_root_to_the_pool_range() -> None:
    pool = UidPool(start=2_000_000, size=65536, ranges=4)
    linux = build_oci_spec("sb", spec(userns_range=2), userns=pool.mapping(2))["linux"]
    expected = [{"containerID": 0, "hostID": 2_000_000 + 2 * 65536, "size": 65536}]
    assert linux["uidMappings"] == expected and linux["gidMappings"] == expected
    assert {"type": "user"} in linux["namespaces"]


def test_opted_out_spec_has_no_user_namespace() -> None:
    linux = build_oci_spec("sb", spec(user_namespace=False))["linux"]
    assert "uidMappings" not in linux
    assert {"type": "user"} not in linux["namespaces"]


def test_pool_refuses_overlap_with_host_users_and_out_of_range_index() -> None:
    with pytest.raises(ValueError, match="start >= 65536"):
        UidPool(start=1000)
    with pytest.raises(ValueError, match="2\\^32"):
        UidPool(start=4_000_000_000, ranges=10_000)
    with pytest.raises(InvalidSpec, match="userns_range 4 is outside"):
        UidPool(ranges=4).mapping(4)


def test_mapping_translates_both_ways() -> None:
    mapping = IdMapping(host_id=1_000_000, size=65536)
    assert mapping.to_host(1000) == 1_001_000
    assert mapping.to_sandbox(1_001_000) == 1000
    assert mapping.to_sandbox(0) is None
    assert host_owner(mapping, (1000, 100)) == (1_001_000, 1_000_100)
    assert host_owner(None, (1000, 100)) == (1000, 100)


def test_tenant_ranges_are_stable_and_spread() -> None:
    assert range_for_tenant("acme", 1024) == range_for_tenant("acme", 1024)
    assert range_for_tenant("default", 1024) == 0  # the warm pool's range
    assert 1 <= range_for_tenant("acme", 1024) < 1024
    assert range_for_tenant("acme", 1) == 0
    assert len({range_for_tenant(f"t{i}", 1024) for i in range(50)}) > 40


def test_opt_out_needs_the_tenants_permission() -> None:
    check_opt_out(True, "t1", tenant_allows=False)
    check_opt_out(False, "t1", tenant_allows=True)
    with pytest.raises(InvalidSpec, match="user_namespace: false is not allowed for tenant 't1'"):
        check_opt_out(False, "t1", tenant_allows=False)


def test_block_io_throttles_the_given_device_only() -> None:
    res = build_oci_spec("sb", spec(io_bps_mb=10, io_iops=500), io_device=(7, 3))["linux"]
    block = res["resources"]["blockIO"]
    assert block["throttleWriteBpsDevice"] == [{"major": 7, "minor": 3, "rate": 10 * MIB}]
    assert block["throttleReadIOPSDevice"] == [{"major": 7, "minor": 3, "rate": 500}]
    assert "blockIO" not in build_oci_spec("sb", spec())["linux"]["resources"]
    unlimited = build_oci_spec("sb", spec(io_bps_mb=None, io_iops=None), io_device=(7, 3))
    assert "blockIO" not in unlimited["linux"]["resources"]


def test_defaults_and_bounds_of_the_new_limits() -> None:
    default = spec()
    assert (default.disk_mb, default.user_namespace, default.egress_mbit) == (1024, True, 100)
    with pytest.raises(ValidationError, match="disk_mb"):
        spec(disk_mb=1)
    with pytest.raises(ValidationError, match="egress_mbit"):
        spec(egress_mbit=0)


def test_tbf_line_shapes_one_device_with_a_sane_burst() -> None:
    line = tbf_qdisc("crl7", 100)
    assert line.startswith("qdisc replace dev crl7 root tbf rate 100mbit ")
    assert "burst 125000 " in line  # 10 ms at 100 Mbit/s
    assert "burst 32768 " in tbf_qdisc("eth0", 1)  # never below one TSO segment


@pytest.mark.skipif(os.geteuid() != 0, reason="lchown needs root")
def test_shift_tree_moves_owners_and_keeps_setuid(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    tool = tmp_path / "bin" / "tool"
    tool.write_bytes(b"x")
    os.chown(tool, 0, 5)
    os.chmod(tool, 0o4755)  # after chown, which clears setuid
    (tmp_path / "link").symlink_to("bin/tool")
    mapping = IdMapping(host_id=3_000_000, size=65536)
    assert shift_tree(tmp_path, mapping) == 4  # root, bin, tool, link
    info = os.lstat(tool)
    assert (info.st_uid, info.st_gid) == (3_000_000, 3_000_005)
    assert stat.S_IMODE(info.st_mode) == 0o4755
    assert os.lstat(tmp_path / "link").st_uid == 3_000_000
    assert os.stat(tmp_path).st_uid == 3_000_000
