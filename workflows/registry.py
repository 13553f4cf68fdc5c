"""Every workflow the workflow worker runs: defined once, here."""

from workflows.admission import AdmissionWorkflow
from workflows.episode import EpisodeWorkflow
from workflows.janitor import JanitorWorkflow
from workflows.nodes import NodeRegistryWorkflow

WORKFLOWS = [EpisodeWorkflow, JanitorWorkflow, NodeRegistryWorkflow, AdmissionWorkflow]
