"""Moved to `contract.models` (issue 24); this shim goes once every import names the new home."""

from contract.models import *  # noqa: F403
