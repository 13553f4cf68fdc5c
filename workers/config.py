"""Moved to `contract.config` (issue 24); this shim goes once every import names the new home."""

from contract.config import *  # noqa: F403
