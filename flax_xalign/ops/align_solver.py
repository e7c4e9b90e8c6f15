"""Similarity -> word links: the one settings record of XLM-Align's extraction.

DWA's self-labelling (`objectives/dwa.py`) and the word aligner
(`evaluation/word_align.py`) both turn a similarity matrix between two token
sequences into links with the same machinery: a similarity (dot product, or
cosine through `ops.l2_normalize`), a few Sinkhorn iterations, Itermax or a
mutual argmax. `AlignmentSolver` holds those hyperparameters once (gin name
`AlignmentSolver`; `DwaConfig.solver` and the aligner's `options` are
instances), with the paper's values (Chi et al. 2021, Table 11) as defaults.

Kernels (see `ops.sinkhorn`): "entropic" is K = exp(S / mu), "clamped" is
K = max(eps, S) with column-then-row normalisation, as XLM-Align's released
code does.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from flax_xalign.errors import UserError
from flax_xalign.ops.itermax import itermax
from flax_xalign.ops.similarity import l2_normalize
from flax_xalign.ops.sinkhorn import SinkhornResult, sinkhorn, uniform_marginals

SIMILARITIES = ("dot", "cosine")
SINKHORN_KERNELS = ("entropic", "clamped")


@dataclasses.dataclass(frozen=True, kw_only=True)
class AlignmentSolver:
  """How similarities become links.

  Attributes:
    similarity: "dot" (XLM-Align and its aligner) or "cosine" (SimAlign).
    sinkhorn_kernel: "entropic" (exp(S / mu)) or "clamped" (max(eps, S), the
      released code's).
    mu: entropic regularisation (paper: 1.0).
    sinkhorn_iters: Sinkhorn iterations (paper: 2).
    itermax_alpha: Itermax discount of already aligned rows/columns (paper: 0.9).
    itermax_rounds: Itermax rounds (paper: 2).
  """

  similarity: str = "dot"
  sinkhorn_kernel: str = "entropic"
  mu: float = 1.0
  sinkhorn_iters: int = 2
  itermax_alpha: float = 0.9
  itermax_rounds: int = 2

  def __post_init__(self):
    if self.similarity not in SIMILARITIES:
      raise UserError(f"unknown similarity {self.similarity!r}; use one of {', '.join(SIMILARITIES)}.")
    if self.sinkhorn_kernel not in SINKHORN_KERNELS:
      raise UserError(f"unknown Sinkhorn kernel {self.sinkhorn_kernel!r}; use one of "
                      f"{', '.join(SINKHORN_KERNELS)}.")
    if not self.mu > 0:
      raise UserError(f"AlignmentSolver.mu must be > 0, got {self.mu!r}.")
    if self.sinkhorn_iters < 1 or self.itermax_rounds < 1:
      raise UserError("AlignmentSolver.sinkhorn_iters and itermax_rounds must be >= 1.")

  def scores(self, a: jax.Array, b: jax.Array) -> jax.Array:
    """[..., n, e] x [..., m, e] -> [..., n, m] float32 similarities."""
    a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    if self.similarity == "cosine":
      a, b = l2_normalize(a), l2_normalize(b)
    return jnp.einsum("...ie,...je->...ij", a, b)

  def plan(self, scores: jax.Array, mask: jax.Array, *, row_segments: jax.Array | None = None,
           col_segments: jax.Array | None = None) -> SinkhornResult:
    """The Sinkhorn transport plan; segments make packed pairs independent problems."""
    marginals = (None, None)
    if self.sinkhorn_kernel == "entropic" and (row_segments is not None or col_segments is not None):
      marginals = uniform_marginals(mask, row_segments=row_segments, col_segments=col_segments)
    return sinkhorn(scores, mask, mu=self.mu, num_iters=self.sinkhorn_iters, kernel=self.sinkhorn_kernel,
                    row_marginal=marginals[0], col_marginal=marginals[1])

  def itermax(self, scores: jax.Array, mask: jax.Array, *, row_segments: jax.Array | None = None,
              col_segments: jax.Array | None = None) -> jax.Array:
    """SimAlign's iterative mutual argmax with this record's alpha and rounds."""
    return itermax(scores, mask, alpha=self.itermax_alpha, max_count=self.itermax_rounds,
                   row_segments=row_segments, col_segments=col_segments)
