"""Every workflow the workflow worker runs: defined once, here."""

from workflows.episode import EpisodeWorkflow
from workflows.janitor import JanitorWorkflow

WORKFLOWS = [EpisodeWorkflow, JanitorWorkflow]
