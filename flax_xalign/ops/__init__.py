"""Numerical kernels: masked batched Sinkhorn, itermax, cosine nearest neighbours, CSLS."""

from flax_xalign.ops.align_solver import AlignmentSolver
from flax_xalign.ops.csls import (
    TopK,
    cosine_topk,
    csls_matrix,
    csls_topk,
    neighbourhood_radius,
)
from flax_xalign.ops.itermax import argmax_intersection, itermax
from flax_xalign.ops.similarity import l2_normalize, nearest_neighbours
from flax_xalign.ops.sinkhorn import SinkhornResult, sinkhorn, uniform_marginals

__all__ = [
    "AlignmentSolver",
    "SinkhornResult",
    "TopK",
    "argmax_intersection",
    "cosine_topk",
    "csls_matrix",
    "csls_topk",
    "itermax",
    "l2_normalize",
    "nearest_neighbours",
    "neighbourhood_radius",
    "sinkhorn",
    "uniform_marginals",
]
