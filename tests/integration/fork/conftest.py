"""Fork tests run on the session stack (tests/integration/conftest.py), share the
episode tests' helpers (sandbox presence per node, polling) and the registry
tests' real registry server (Debian's docker-registry on a loopback port)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_INTEGRATION = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_INTEGRATION / "episodes"))
sys.path.insert(0, str(_INTEGRATION / "registry"))


def _registry_fixtures() -> object:
    """The registry tests' conftest, loaded under its own name (two modules may not
    both be called `conftest`)."""
    spec = importlib.util.spec_from_file_location(
        "registry_fixtures", _INTEGRATION / "registry" / "conftest.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


open_registry = _registry_fixtures().open_registry  # type: ignore[attr-defined]
