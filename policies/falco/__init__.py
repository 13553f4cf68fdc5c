"""Falco rule language: loader, condition compiler, field catalogue and engine."""
