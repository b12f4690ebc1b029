"""The one error a planner raises."""

from __future__ import annotations


class PlanError(RuntimeError):
    """What a planner cannot start (an image that cannot run here, a variant whose model data is missing): one
    line for the developer; `local up` reports it and exits 2."""
