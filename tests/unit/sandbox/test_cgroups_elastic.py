"""ElasticCpu's counting over a cgroup tree laid out like the host's (in a temp dir)."""

from __future__ import annotations

from pathlib import Path

from sandbox.cgroups import IDLE_SHARES, ElasticCpu, busy_shares, cgroup_dir, read_shares


def _cgroup(root: Path, sandbox_id: str, quota_us: int) -> None:
    folder = cgroup_dir(sandbox_id, root=root)
    folder.mkdir(parents=True)
    (folder / "cpu.shares").write_text(str(IDLE_SHARES))
    (folder / "cpu.cfs_quota_us").write_text(str(quota_us))
    (folder / "cpu.cfs_period_us").write_text("100000")


def test_overlapping_steps_keep_full_weight_until_the_last_ends(tmp_path: Path) -> None:
    _cgroup(tmp_path, "a", 150_000)
    cpu = ElasticCpu(tmp_path)
    with cpu.busy("a", {}):
        assert read_shares("a", tmp_path) == 1536  # 1.5 cores
        with cpu.busy("a", {}):
            assert cpu.running("a") == 2 and cpu.busy_sandboxes() == 1
        assert read_shares("a", tmp_path) == 1536
    assert read_shares("a", tmp_path) == IDLE_SHARES
    assert cpu.busy_sandboxes() == 0


def test_reserved_sandboxes_and_missing_cgroups_are_left_alone(tmp_path: Path) -> None:
    _cgroup(tmp_path, "r", 100_000)
    cpu = ElasticCpu(tmp_path)
    with cpu.busy("r", {"corral.cpu": "reserved"}):
        assert read_shares("r", tmp_path) == IDLE_SHARES  # untouched (test layout value)
    with cpu.busy("gone", {}):  # torn down meanwhile: no error, nothing written
        pass
    assert not cgroup_dir("gone", root=tmp_path).exists()


def test_a_failing_step_still_drops_the_weight(tmp_path: Path) -> None:
    _cgroup(tmp_path, "f", 100_000)
    cpu = ElasticCpu(tmp_path)
    try:
        with cpu.busy("f", {}):
            raise RuntimeError("step failed")
    except RuntimeError:
        pass
    assert read_shares("f", tmp_path) == IDLE_SHARES


def test_busy_shares_are_bounded() -> None:
    assert busy_shares(0.001) == IDLE_SHARES
    assert busy_shares(1) == 1024
    assert busy_shares(10_000) == 262_144


def test_thaw_directly_writes_the_freezer_of_either_cgroup_version(tmp_path: Path) -> None:
    from sandbox.cgroups import thaw_directly

    v1 = tmp_path / "v1" / "freezer" / "corral" / "abc" / "freezer.state"
    v1.parent.mkdir(parents=True)
    v1.write_text("FROZEN\n")
    assert thaw_directly("abc", root=tmp_path / "v1") and v1.read_text() == "THAWED"
    assert not thaw_directly("abc", root=tmp_path / "v1")  # already thawed: nothing to do

    v2 = tmp_path / "v2" / "corral" / "abc" / "cgroup.freeze"
    v2.parent.mkdir(parents=True)
    v2.write_text("1\n")
    assert thaw_directly("abc", root=tmp_path / "v2") and v2.read_text() == "0"
    assert not thaw_directly("gone", root=tmp_path / "v2")  # no cgroup: the sandbox is gone
