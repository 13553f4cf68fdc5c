"""Fixtures for the observability unit tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from obs_synthetic import Synthetic, make_synthetic, write_synthetic


@pytest.fixture
def synthetic() -> Synthetic:
    return make_synthetic()


@pytest.fixture
def records_dir(tmp_path: Path, synthetic: Synthetic) -> Path:
    d = tmp_path / "records"
    write_synthetic(d, synthetic)
    return d
