"""Moved to `contract.search_attributes` (issue 24); this shim goes once every import names the new home."""

from contract.search_attributes import *  # noqa: F403
