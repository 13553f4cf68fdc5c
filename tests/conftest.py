"""Test-wide settings. The real stack lives in tests/integration/conftest.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def shared_dir() -> Path:
    """`../shared` beside the repository (CI lays it there), or $CORRAL_SHARED_DIR."""
    return Path(os.environ.get("CORRAL_SHARED_DIR", REPO.parent / "shared"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: takes a minute or more (debootstrap, big batches)")
