"""Deterministic Temporal workflows and their inputs and results."""

from workflows.episode import EpisodeWorkflow
from workflows.janitor import JanitorWorkflow

WORKFLOWS = [EpisodeWorkflow, JanitorWorkflow]

__all__ = ["WORKFLOWS", "EpisodeWorkflow", "JanitorWorkflow"]
