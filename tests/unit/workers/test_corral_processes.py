"""Pid-file process management, on real child processes."""

from __future__ import annotations

import time
from pathlib import Path

from workers.processes import ManagedProcess, group_members, pid_alive


def test_start_is_idempotent_and_stop_kills_the_group(tmp_path: Path) -> None:
    proc = ManagedProcess("sleeper", tmp_path)
    pid = proc.start(["sh", "-c", "sleep 300 & sleep 300"])
    try:
        assert proc.start(["false"]) == pid  # already running: not started twice
        assert proc.running()
        deadline = time.monotonic() + 10
        while len(group_members(pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)  # the shell and both sleeps lead or join its group
        assert len(group_members(pid)) == 3
    finally:
        assert proc.stop(grace_s=2)
    assert not pid_alive(pid)
    assert group_members(pid) == []  # the children went with the parent
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
