"""Optional dependencies: the dataframe and plotting libraries live in extras.

`pip install corral` is what a trainer needs to start episodes; Parquet
records and exports need `corral[export]` (polars, pyarrow), reports
`corral[report]` (also matplotlib). The modules that use them import them
through `require`, at the point of use, so that everything else imports
without them and a missing one is one line naming the extra to install.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["MissingExtra", "require", "require_at_start"]


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message names the extra."""


def require(module: str, extra: str, feature: str) -> ModuleType:
    """`module`, imported; `MissingExtra` naming `corral[extra]` when it is absent."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise MissingExtra(
            f"{feature} needs {module.split('.')[0]}, which is not installed: "
            f"pip install 'corral[{extra}]'"
        ) from err


def require_at_start(module: str, extra: str, feature: str) -> None:
    """For a process's entry point: without `module`, exit now with one line, before
    the process starts serving (and not with a traceback at its first record)."""
    try:
        require(module, extra, feature)
    except MissingExtra as err:
        raise SystemExit(f"error: {err}") from None
