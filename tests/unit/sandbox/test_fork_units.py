"""Snapshot names and durable-exec files: the logic under fork and crash safety."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from contract.ids import is_local_snapshot, service_snapshot_ref, snapshot_ref
from sandbox.exec_io import ExecFiles


@pytest.mark.parametrize(
    ("episode", "name", "ref"),
    [
        ("ep-1234", "s1", "corral/snapshots/ep-1234:s1"),
        ("Batch_7/Run 2", "after setup", "corral/snapshots/batch-7-run-2:after-setup"),
        ("--", "..x", "corral/snapshots/episode:x"),
        ("ep", "", "corral/snapshots/ep:latest"),
    ],
)
def test_snapshot_refs_are_valid_references(episode: str, name: str, ref: str) -> None:
    assert snapshot_ref(episode, name) == ref


def test_snapshot_tags_are_cut_at_128_characters() -> None:
    assert len(snapshot_ref("ep", "x" * 300).split(":")[1]) == 128


def test_a_service_snapshot_is_named_after_its_episode_snapshot_and_service() -> None:
    ref = snapshot_ref("ep-1", "fork-ab12")
    assert service_snapshot_ref(ref, "db") == "corral/snapshots/ep-1:fork-ab12.db"
    long = service_snapshot_ref(snapshot_ref("ep", "x" * 300), "db")
    assert long.endswith(".db") and len(long.split(":")[1]) == 128
    assert is_local_snapshot(long)


@pytest.mark.parametrize(
    ("image", "local"),
    [
        ("corral/snapshots/ep:s1", True),
        ("corral.local/corral/snapshots/ep:s1", True),
        ("localhost:5000/corral/snapshots/ep:s1", False),  # pushed: pulled, not copied
        ("busybox", False),
    ],
)
def test_only_local_snapshots_are_copied_between_nodes(image: str, local: bool) -> None:
    assert is_local_snapshot(image) is local


def test_exec_files_record_the_end_and_cap_the_output(tmp_path: Path) -> None:
    async def scenario() -> None:
        files = ExecFiles.create(tmp_path / "0.out", with_stdin=False)
        assert files.started and files.end() is None
        Path(files.stdout_path).write_bytes(b"o" * 10)
        Path(files.stderr_path).write_bytes(b"e" * 10)
        files.record_end(3, timed_out=False)
        again = ExecFiles(tmp_path / "0.out")  # what a restarted worker sees
        end = again.end()
        assert end is not None and end[:2] == (3, False)
        assert again.output(12) == (b"o" * 10, b"ee", True)
        assert again.output(20) == (b"o" * 10, b"e" * 10, False)
        await files.close()

    asyncio.run(scenario())


def test_a_fresh_start_forgets_an_attempt_that_never_ran(tmp_path: Path) -> None:
    async def scenario() -> None:
        first = ExecFiles.create(tmp_path / "1.out", with_stdin=True)
        first.record_end(0, timed_out=False)
        await first.close()
        second = ExecFiles.create(tmp_path / "1.out", with_stdin=False)
        assert second.end() is None
        assert Path(second.stdout_path).read_bytes() == b""
        await second.close()

    asyncio.run(scenario())


def test_an_exec_that_never_started_has_no_files(tmp_path: Path) -> None:
    assert not ExecFiles(tmp_path / "2.out").started
