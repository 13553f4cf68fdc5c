"""Corral's search attributes, defined once for the workflow, the SDK and the CLI.

They are registered with the server by `corral up` (temporal-dev.yaml lists
them). Only states on-call filters by are written (see `EpisodeWorkflow`).
"""

from __future__ import annotations

from temporalio.common import SearchAttributeKey

EPISODE_STATE = SearchAttributeKey.for_keyword("EpisodeState")
SANDBOX_NODE = SearchAttributeKey.for_keyword("SandboxNode")
SANDBOX_IMAGE = SearchAttributeKey.for_keyword("SandboxImage")
SANDBOX_ID = SearchAttributeKey.for_keyword("SandboxId")
PARENT_EPISODE = SearchAttributeKey.for_keyword("ParentEpisode")
ANOMALY_RULE = SearchAttributeKey.for_keyword_list("AnomalyRule")
TENANT = SearchAttributeKey.for_keyword("Tenant")
