"""Moved to `contract.search_attributes` (issue 24): a shim until the imports move."""

from contract.search_attributes import *  # noqa: F403
