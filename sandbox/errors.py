"""Moved to `contract.errors` (issue 24); this shim goes once every import names the new home."""

from contract.errors import *  # noqa: F403
