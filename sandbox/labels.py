"""Moved to `contract.labels` (issue 24); this shim goes once every import names the new home."""

from contract.labels import *  # noqa: F403
