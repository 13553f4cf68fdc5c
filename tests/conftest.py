"""Test-wide settings. The real stack lives in tests/integration/conftest.py."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.fake_openai import FakeOpenAI

REPO = Path(__file__).resolve().parents[1]


def shared_dir() -> Path:
    """`../shared` beside the repository (CI lays it there), or $CORRAL_SHARED_DIR."""
    return Path(os.environ.get("CORRAL_SHARED_DIR", REPO.parent / "shared"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: takes a minute or more (debootstrap, big batches)")


@pytest_asyncio.fixture
async def fake_openai() -> AsyncIterator[FakeOpenAI]:
    """A local OpenAI-compatible server (tests/fake_openai.py), the model gateway's upstream."""
    fake = FakeOpenAI()
    await fake.start()
    yield fake
    await fake.stop()
