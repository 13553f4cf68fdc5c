"""Background processes by pid file: start detached, check, stop.

PID 1 on these machines is not systemd, so the stack keeps its own books:
each process has `<name>.pid` and `<name>.log` under the stack's `run/`
folder, runs in its own session (it outlives the `corral up` that started
it) and is stopped by pid, SIGTERM first and SIGKILL after a grace period.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ManagedProcess:
    name: str
    run_dir: Path

    @property
    def pid_file(self) -> Path:
        return self.run_dir / f"{self.name}.pid"

    @property
    def log_file(self) -> Path:
        return self.run_dir / f"{self.name}.log"

    def pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if pid_alive(pid) else None

    def running(self) -> bool:
        return self.pid() is not None

    def start(
        self, argv: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> int:
        """Start unless already running; returns the pid."""
        existing = self.pid()
        if existing is not None:
            return existing
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as log:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **(env or {})},
                cwd=cwd,
            )
        self.pid_file.write_text(str(proc.pid))
        return proc.pid

    def stop(self, grace_s: float = 10.0) -> bool:
        """Stop by pid; True if something was running."""
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        _signal_group(pid, signal.SIGTERM)
        # The leader often exits first: its group (children it started) too.
        if not (wait_exit(pid, grace_s) and _wait_group_gone(pid, grace_s)):
            _signal_group(pid, signal.SIGKILL)
            wait_exit(pid, 5.0)
            _wait_group_gone(pid, 5.0)
        self.pid_file.unlink(missing_ok=True)
        return True

    def log_tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        return ""


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours still answers kill(0); treat it as gone.
    with contextlib.suppress(OSError):
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "Z":
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            return False
    return True


def wait_exit(pid: int, timeout_s: float) -> bool:
    return _wait_until(lambda: not pid_alive(pid), timeout_s)


def _wait_until(done: Callable[[], bool], timeout_s: float) -> bool:
    """Poll `done` until true or `timeout_s` has passed; its last answer."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if done():
            return True
        time.sleep(0.05)
    return done()


def group_members(pgid: int) -> list[int]:
    """Live processes in process group `pgid` (zombies count as gone)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def _wait_group_gone(pgid: int, timeout_s: float) -> bool:
    return _wait_until(lambda: not group_members(pgid), timeout_s)


def _signal_group(pid: int, sig: int) -> None:
    """Signal the process's whole session group (it started its own), else itself."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
