"""Run Python in a child process where some packages cannot be imported, as
if they were not installed: a finder ahead of every other one refuses them."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_BLOCKER = """
import importlib.abc, sys

class _NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, _NotInstalled())
"""


def run_without(packages: Iterable[str], body: str) -> subprocess.CompletedProcess[str]:
    """`body` run by this interpreter from the repository root, `packages` blocked."""
    blocker = _BLOCKER.format(blocked=tuple(sorted(packages)))
    return subprocess.run(
        [sys.executable, "-c", blocker + body],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
