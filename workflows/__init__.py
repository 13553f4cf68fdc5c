"""Deterministic Temporal workflows and their inputs and results.

The worker's list of workflows is in `workflows.registry`, so importing a
model from here does not pull in every workflow module.
"""
