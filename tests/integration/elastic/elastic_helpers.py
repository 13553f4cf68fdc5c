"""Helpers of the elastic node tests."""

from __future__ import annotations

import uuid

from contract.models import EpisodeSpec, ProvisionInput


def provision_input(spec: EpisodeSpec) -> ProvisionInput:
    """A provision of `spec` under a fresh sandbox id, as an episode would send it."""
    workflow_id = f"elastic-{uuid.uuid4().hex[:8]}"
    return ProvisionInput(
        sandbox_id=uuid.uuid4().hex * 2, spec=spec, labels={"corral.workflow_id": workflow_id}
    )
