"""Pid-file process management, on real child processes."""

from __future__ import annotations

import time
from pathlib import Path

from workers.processes import ManagedProcess, pid_alive


def _group_members(pgid: int) -> list[int]:
    """Live processes whose process group is `pgid` (zombies count as gone)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def test_start_is_idempotent_and_stop_kills_the_group(tmp_path: Path) -> None:
    proc = ManagedProcess("sleeper", tmp_path)
    pid = proc.start(["sh", "-c", "sleep 300 & sleep 300"])
    try:
        assert proc.start(["false"]) == pid  # already running: not started twice
        assert proc.running()
        deadline = time.monotonic() + 10
        while len(_group_members(pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)  # the shell and both sleeps lead or join its group
        assert len(_group_members(pid)) == 3
    finally:
        assert proc.stop(grace_s=2)
    assert not pid_alive(pid)
    assert _group_members(pid) == []  # the children went with the parent
    assert not proc.pid_file.exists()
    assert not proc.stop()


def test_a_stale_pid_file_means_not_running(tmp_path: Path) -> None:
    proc = ManagedProcess("gone", tmp_path)
    proc.pid_file.write_text("999999")
    assert proc.pid() is None and not proc.running()


def test_log_tail_shows_the_last_lines(tmp_path: Path) -> None:
    proc = ManagedProcess("talker", tmp_path)
    pid = proc.start(["sh", "-c", "for i in 1 2 3; do echo line$i; done"])
    from workers.processes import wait_exit

    wait_exit(pid, 5)
    assert proc.log_tail(2).splitlines() == ["line2", "line3"]
