"""Fork tests run on the session stack (tests/integration/conftest.py) and share
the episode tests' helpers (sandbox presence per node, polling)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "episodes"))
