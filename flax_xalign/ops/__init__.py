"""Numerical kernels: masked batched Sinkhorn, itermax, cosine nearest neighbours, CSLS, sparse lookup."""

from flax_xalign.ops import cooc_lookup  # The module: cooc_lookup.lookup(...).
from flax_xalign.ops.align_solver import AlignmentSolver
from flax_xalign.ops.cooc_lookup import CoocLookup, csr_from_pairs
from flax_xalign.ops.csls import (
    TopK,
    cosine_topk,
    csls_matrix,
    csls_topk,
    nearest_neighbours,
    neighbourhood_radius,
)
from flax_xalign.ops.itermax import argmax_intersection, itermax
from flax_xalign.ops.similarity import l2_normalize
from flax_xalign.ops.sinkhorn import SinkhornResult, sinkhorn, uniform_marginals

__all__ = [
    "AlignmentSolver",
    "CoocLookup",
    "SinkhornResult",
    "TopK",
    "argmax_intersection",
    "cooc_lookup",
    "cosine_topk",
    "csls_matrix",
    "csls_topk",
    "csr_from_pairs",
    "itermax",
    "l2_normalize",
    "nearest_neighbours",
    "neighbourhood_radius",
    "sinkhorn",
    "uniform_marginals",
]
