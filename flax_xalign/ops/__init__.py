"""Numerical kernels: masked batched Sinkhorn, itermax, cosine nearest neighbours."""

from flax_xalign.ops.align_solver import AlignmentSolver
from flax_xalign.ops.itermax import argmax_intersection, itermax
from flax_xalign.ops.similarity import l2_normalize, nearest_neighbours
from flax_xalign.ops.sinkhorn import SinkhornResult, sinkhorn, uniform_marginals

__all__ = [
    "AlignmentSolver",
    "SinkhornResult",
    "argmax_intersection",
    "itermax",
    "l2_normalize",
    "nearest_neighbours",
    "sinkhorn",
    "uniform_marginals",
]
