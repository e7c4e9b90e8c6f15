"""Numerical kernels: masked batched Sinkhorn and itermax word alignment."""

from flax_xalign.ops.itermax import argmax_intersection, itermax
from flax_xalign.ops.sinkhorn import SinkhornResult, sinkhorn, uniform_marginals

__all__ = [
    "SinkhornResult",
    "argmax_intersection",
    "itermax",
    "sinkhorn",
    "uniform_marginals",
]
