"""The frameworks are optional: a missing one is one line naming its extra."""

from __future__ import annotations

import importlib
from types import ModuleType

from corral.errors import CorralError


class MissingFramework(CorralError, ImportError):
    """The adapter's framework (or one of its own dependencies) is not installed."""


def require(module: str, extra: str) -> ModuleType:
    """Import `module`, or fail with the `pip install` line that brings it."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        missing = err.name or module
        what = (
            f"{module} is not installed"
            if missing.split(".")[0] == module
            else (f"{module} needs {missing}, which is not installed")
        )
        raise MissingFramework(f"{what}: pip install 'corral[{extra}]'") from err
