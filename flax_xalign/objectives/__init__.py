"""Objectives: corruption and loss as pure functions, composed by a registry.

This is the one registration list: importing the package imports every
built-in objective module, each of which adds its names with `@register`.
A new objective is a module here plus a line below. The pretraining model
that composes them is `objectives.model.PretrainingModel`.
"""

from flax_xalign.objectives.base import LossTerm, Objective, StepContext, get, names, register

# The built-ins, one module per registered name (mlm.py holds mlm and tlm,
# code_switch.py tcs and scs).
from flax_xalign.objectives import align_mlm  # noqa: F401,E402  (align)
from flax_xalign.objectives import code_switch  # noqa: F401,E402  (tcs, scs)
from flax_xalign.objectives import dict_mlm  # noqa: F401,E402  (dict_mlm)
from flax_xalign.objectives import dwa  # noqa: F401,E402  (dwa)
from flax_xalign.objectives import gc  # noqa: F401,E402  (gc)
from flax_xalign.objectives import mlm  # noqa: F401,E402  (mlm, tlm)
from flax_xalign.objectives import so  # noqa: F401,E402  (so: awesome-align's self-training)

__all__ = ["LossTerm", "Objective", "StepContext", "get", "names", "register"]
