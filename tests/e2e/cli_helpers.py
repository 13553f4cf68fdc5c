"""Running `corral` as a user does, and finding what a stack left running."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def corral(
    *args: str, env: dict[str, str], check: bool = True, cwd: Path = REPO, timeout_s: float = 300
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "corral", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=timeout_s,
    )
    if check and done.returncode != 0:
        raise AssertionError(f"corral {' '.join(args)} exited {done.returncode}:\n{done.stderr}")
    return done


def processes_of(state: str) -> list[str]:
    """Command lines that mention a stack's state directory (other than ours)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if state in cmdline:
                found.append(f"{entry.name}: {cmdline[:120]}")
    return found
