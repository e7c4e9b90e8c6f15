"""Similarity -> word links: the one settings record of XLM-Align's extraction.

DWA's self-labelling (`objectives/dwa.py`) and the word aligner
(`evaluation/word_alignment/word_align.py`) both turn a similarity matrix between two token
sequences into links with the same machinery: a similarity (dot product, or
cosine through `ops.l2_normalize`), a few Sinkhorn iterations, Itermax or a
mutual argmax. `AlignmentSolver` holds those hyperparameters once (gin name
`AlignmentSolver`; `DwaConfig.solver` and the aligner's `options` are
instances), with the paper's values (Chi et al. 2021, §3.1 and Table 11) as
defaults: dot products, the kernel `K = max(eps, S)^(1/mu)` (Eq. 1 + 5), two
row-then-column iterations from `v = 1` with all-ones marginals (Eq. 6), both
argmaxes on the plan (Eq. 7), Itermax with alpha 0.9 and 2 rounds. The
aligner's methods (`METHODS`) are the mutual argmax, SimAlign's Itermax, the
Sinkhorn argmaxes (Eq. 7), Sinkhorn followed by Itermax (§3.1, Eq. 7-9:
what DWA self-labels with and the paper's Table 2 scores) and awesome-align's
softmax thresholding (Dou & Neubig 2021: a link where both the row softmax and
the column softmax of the similarity exceed a threshold, 1e-3), and SimAlign's
"match" (`mwmf`: a maximum-weight matching of the similarity with min(n, m)
links; solved on the host by `match_links`, as it is no array program).

Switches to the released code's choices (microsoft/unilm infoxlm, the
XLM-Align aligner), see `ops.sinkhorn`: `sinkhorn_order="columns_first"`
(`_sinkhorn_iter`'s column-then-row normalisation), `sinkhorn_extraction=
"pi_xi"` (forward links from the last row-normalised iterate `pi`, backward
links from the last column-normalised one `xi`, as `xlmalign-ot-aligner.py`
does). `sinkhorn_kernel="entropic"` is textbook entropic OT, `exp(S / T)`,
with `T = mu * mean |S|` unless `relative_mu=False`.

Argmaxes on a plan never break exact ties by position: a tie goes to the
larger raw similarity (then to the first index).
"""

from __future__ import annotations

import dataclasses
import numbers

import jax
import jax.numpy as jnp
import numpy as np

from flax_xalign.errors import UserError
from flax_xalign.ops.itermax import argmax_intersection, itermax
from flax_xalign.ops.similarity import l2_normalize
from flax_xalign.ops.sinkhorn import KERNELS, ORDERS, SinkhornResult, sinkhorn

SIMILARITIES = ("dot", "cosine")
SINKHORN_KERNELS = KERNELS
SINKHORN_ORDERS = ORDERS
SINKHORN_EXTRACTIONS = ("plan", "pi_xi")
METHODS = ("argmax", "itermax", "sinkhorn", "sinkhorn_itermax", "softmax", "match")


def _one_of(name: str, value: str, choices: tuple[str, ...]) -> None:
  if value not in choices:
    raise UserError(f"unknown {name.replace('_', ' ')} {value!r} (AlignmentSolver.{name}); "
                    f"use one of {', '.join(choices)}.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class AlignmentSolver:
  """How similarities become links.

  Attributes:
    similarity: "dot" (XLM-Align and its aligner) or "cosine" (SimAlign).
    sinkhorn_kernel: "clamped", `K = max(eps, S)^(1/mu)` (the paper's Eq. 1
      + 5; the released code's `max(eps, S)` at mu = 1), or "entropic",
      `K = exp(S / T)` (textbook entropic OT).
    sinkhorn_order: "rows_first" (Eq. 6: u then v) or "columns_first" (the
      released code's column-then-row normalisation).
    mu: regularisation (paper: 1.0); the exponent 1/mu of the clamped
      kernel, or the entropic temperature (relative or absolute).
    relative_mu: entropic kernel only: temperature `mu * mean |S|` over each
      problem's valid entries (as ott-jax scales epsilon by the mean cost);
      False: `mu` itself, which saturates on raw dot products.
    clamp_epsilon: the `eps` of `max(eps, S)`.
    sinkhorn_iters: Sinkhorn iterations (paper: 2).
    sinkhorn_extraction: how the aligner's "sinkhorn" method reads links off
      the Sinkhorn result: "plan" (Eq. 7: both argmaxes on the plan) or
      "pi_xi" (the released aligner: row argmaxes on the last row-normalised
      iterate, column argmaxes on the last column-normalised one).
    itermax_alpha: Itermax discount of already aligned rows/columns (paper: 0.9).
    itermax_rounds: Itermax rounds (paper: 2).
    softmax_threshold: the "softmax" method's threshold on both softmaxes
      (awesome-align's default: 1e-3).
  """

  similarity: str = "dot"
  sinkhorn_kernel: str = "clamped"
  sinkhorn_order: str = "rows_first"
  mu: float = 1.0
  relative_mu: bool = True
  clamp_epsilon: float = 1e-6
  sinkhorn_iters: int = 2
  sinkhorn_extraction: str = "plan"
  itermax_alpha: float = 0.9
  itermax_rounds: int = 2
  softmax_threshold: float = 1e-3

  def __post_init__(self):
    _one_of("similarity", self.similarity, SIMILARITIES)
    _one_of("sinkhorn_kernel", self.sinkhorn_kernel, SINKHORN_KERNELS)
    _one_of("sinkhorn_order", self.sinkhorn_order, SINKHORN_ORDERS)
    _one_of("sinkhorn_extraction", self.sinkhorn_extraction, SINKHORN_EXTRACTIONS)
    if not isinstance(self.relative_mu, bool):
      raise UserError(f"AlignmentSolver.relative_mu must be True or False, got {self.relative_mu!r}.")
    threshold = self.softmax_threshold
    if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real) or not 0 < threshold < 1:
      raise UserError(f"AlignmentSolver.softmax_threshold must be in (0, 1) (awesome-align: 1e-3), got "
                      f"{threshold!r}.")
    for name in ("mu", "clamp_epsilon"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
        raise UserError(f"AlignmentSolver.{name} must be a number > 0, got {value!r}.")
    for name in ("sinkhorn_iters", "itermax_rounds"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise UserError(f"AlignmentSolver.{name} must be an integer >= 1, got {value!r}.")
    alpha = self.itermax_alpha
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not 0 <= alpha <= 1:
      raise UserError(f"AlignmentSolver.itermax_alpha must be in [0, 1] (SimAlign: 0.9), got {alpha!r}.")

  def scores(self, a: jax.Array, b: jax.Array) -> jax.Array:
    """[..., n, e] x [..., m, e] -> [..., n, m] float32 similarities."""
    a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    if self.similarity == "cosine":
      a, b = l2_normalize(a), l2_normalize(b)
    return jnp.einsum("...ie,...je->...ij", a, b)

  def plan(self, scores: jax.Array, mask: jax.Array, *, row_segments: jax.Array | None = None,
           col_segments: jax.Array | None = None) -> SinkhornResult:
    """The Sinkhorn result of [..., n, m] `scores`; segments make packed pairs independent problems."""
    return sinkhorn(scores, mask, mu=self.mu, num_iters=self.sinkhorn_iters, kernel=self.sinkhorn_kernel,
                    order=self.sinkhorn_order, relative_mu=self.relative_mu,
                    clamp_epsilon=self.clamp_epsilon, row_segments=row_segments,
                    col_segments=col_segments)

  def itermax(self, scores: jax.Array, mask: jax.Array, *, row_segments: jax.Array | None = None,
              col_segments: jax.Array | None = None, tie_break: jax.Array | None = None) -> jax.Array:
    """SimAlign's iterative mutual argmax of `scores` with this record's alpha and rounds."""
    return itermax(scores, mask, alpha=self.itermax_alpha, max_count=self.itermax_rounds,
                   row_segments=row_segments, col_segments=col_segments, tie_break=tie_break)

  def links(self, similarity: jax.Array, mask: jax.Array, method: str, *,
            row_segments: jax.Array | None = None, col_segments: jax.Array | None = None) -> jax.Array:
    """Word links of [..., n, m] similarities (as `scores` computes them) by `method`.

    * "argmax": the mutual argmax of the similarity.
    * "itermax": SimAlign's itermax on `(cos + 1) / 2` for cosine similarity
      (what SimAlign feeds it); dot products are shifted by each problem's
      minimum instead (a variant: the reweighting is multiplicative, so the
      offset matters, and dot products have no natural one).
    * "sinkhorn": the Sinkhorn result, links read off per
      `sinkhorn_extraction`, exact ties broken by the similarity.
    * "sinkhorn_itermax": the paper's §3.1 procedure (Table 2's "Optimal
      Transport (Section 3.1)"): Itermax on the Sinkhorn plan, exactly the
      labels DWA trains on (`self_labels`); `sinkhorn_extraction` does not
      apply (Itermax reads the plan, as the released `iter_max(pi)`).
    * "softmax": awesome-align's extraction: the softmax of each row and of
      each column of the similarity over its problem's valid entries, a link
      where both exceed `softmax_threshold`. awesome-align applies it to dot
      products (`similarity="dot"`); on cosines (values in [-1, 1]) the
      softmaxes are nearly flat and most pairs pass the threshold.

    Args:
      similarity: [..., n, m] float similarities.
      mask: [..., n, m] bool, True on real token pairs (block diagonal with
        segments).
      method: one of METHODS.
      row_segments, col_segments: optional [..., n] / [..., m] problem ids of
        packed pairs.

    Returns:
      [..., n, m] bool links, False where `~mask`.
    """
    _one_of_methods(method)
    if method in HOST_METHODS:
      raise ValueError(f"method {method!r} is solved on the host from the similarity: use HOST_METHODS[{method!r}]")
    similarity = jnp.asarray(similarity).astype(jnp.float32)
    mask = jnp.broadcast_to(jnp.asarray(mask, dtype=bool), similarity.shape)
    segments = {"row_segments": row_segments, "col_segments": col_segments}
    if method == "argmax":
      links = argmax_intersection(similarity, mask)
    elif method == "itermax":
      scores = (similarity + 1.0) / 2.0 if self.similarity == "cosine" else similarity
      links = self.itermax(scores, mask, **segments)
    elif method == "softmax":
      links = softmax_links(similarity, mask, threshold=self.softmax_threshold)
    elif method == "sinkhorn_itermax":
      # One code path with DWA's self-labelling, so the aligner scores the very labels DWA learns from.
      links, _ = self.self_labels(similarity, mask, **segments)
    else:
      result = self.plan(similarity, mask, **segments)
      if self.sinkhorn_extraction == "plan":
        links = argmax_intersection(result.plan, mask, tie_break=similarity)
      else:
        links = argmax_intersection(result.row_plan, mask, col_scores=result.col_plan,
                                    tie_break=similarity)
    return links & mask

  def self_labels(self, scores: jax.Array, mask: jax.Array, *, row_segments: jax.Array | None = None,
                  col_segments: jax.Array | None = None) -> tuple[jax.Array, SinkhornResult]:
    """DWA's self-labels: Itermax on the Sinkhorn plan (paper §3.1, the released `iter_max(pi)`).

    Args:
      scores: [..., n, m] similarities of the uncorrupted pair.
      mask: [..., n, m] bool where links may lie.
      row_segments, col_segments: optional problem ids of packed pairs.

    Returns:
      (links [..., n, m] bool, the SinkhornResult). Exact ties of the plan
      go to the larger raw score.
    """
    scores = jnp.asarray(scores).astype(jnp.float32)
    result = self.plan(scores, mask, row_segments=row_segments, col_segments=col_segments)
    links = self.itermax(result.plan, mask, row_segments=row_segments, col_segments=col_segments,
                         tie_break=scores)
    return links & mask, result


def softmax_links(similarity: jax.Array, mask: jax.Array, *, threshold: float) -> jax.Array:
  """[..., n, m] bool: both the row softmax and the column softmax of `similarity` over `mask` > `threshold`.

  Rows or columns without a valid entry have no link (and no NaN reaches the result).
  """
  safe = jnp.where(mask, similarity, 0.0)

  def masked_softmax(axis: int) -> jax.Array:
    top = jnp.max(jnp.where(mask, safe, -jnp.inf), axis=axis, keepdims=True)
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    weights = jnp.where(mask, jnp.exp(safe - top), 0.0)
    total = jnp.sum(weights, axis=axis, keepdims=True)
    return weights / jnp.where(total > 0, total, 1.0)

  return (masked_softmax(-1) > threshold) & (masked_softmax(-2) > threshold) & mask


def match_links(similarity: np.ndarray) -> np.ndarray:
  """SimAlign's "match" (mwmf) on one unpadded [n, m] problem: bool [n, m] links of a maximum-weight matching.

  SimAlign runs networkx's max_weight_matching(maxcardinality=True) on `(cos + 1) / 2`; with every edge
  present that is a rectangular assignment of min(n, m) links maximising the summed similarity, which is
  unchanged by adding a constant to, or positively scaling, every entry: cosines, shifted cosines and dot
  products of one problem give the same matching up to ties. Solved with scipy's linear_sum_assignment.
  """
  from scipy.optimize import linear_sum_assignment

  similarity = np.asarray(similarity, np.float64)
  links = np.zeros(similarity.shape, bool)
  if similarity.size:
    rows, cols = linear_sum_assignment(similarity, maximize=True)
    links[rows, cols] = True
  return links


# Methods solved on the host, one unpadded [n, m] problem at a time, from the similarity: not inside `links`.
HOST_METHODS = {"match": match_links}


def _one_of_methods(method: str) -> None:
  if method not in METHODS:
    raise UserError(f"unknown alignment method {method!r}; use one of {', '.join(METHODS)}.")
