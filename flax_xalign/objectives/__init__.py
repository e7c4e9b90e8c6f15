"""Objectives: corruption and loss as pure functions, composed by a registry."""

from flax_xalign.objectives import mlm  # noqa: F401  (registers 'mlm' and 'tlm')
from flax_xalign.objectives.base import LossTerm, Objective, StepContext, get, names, register

__all__ = ["LossTerm", "Objective", "StepContext", "get", "names", "register"]
