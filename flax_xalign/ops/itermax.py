"""Word alignments from a score matrix: argmax intersection and itermax.

`itermax` is SimAlign's Itermax (Jalili Sabet et al., 2020), which XLM-Align
(Chi et al., 2021, Eq. 7-9) applies to its Sinkhorn plans, with SimAlign's
settings `alpha = 0.9, max_count = 2`:

1. Align (i, j) when j is the argmax of row i and i the argmax of column j.
2. Unless the problem has at most 2 real rows or columns, repeat up to
   `max_count - 1` times: down-weight the scores by `alpha` where exactly one
   of row i / column j is aligned already and by 0 where both are (clip of
   `alpha * unaligned_row + alpha * unaligned_col` to [0, 1]), and add the
   mutual argmaxes of the reweighted matrix that touch an unaligned row or
   column. A problem with no unaligned row or no unaligned column left adds
   nothing, and a round that adds nothing leaves every later round identical,
   so a fixed number of rounds gives SimAlign's early-stopping result.

Batching: any leading axes are batch axes and padding is given by `mask`; the
result equals SimAlign on each unpadded problem. With `row_segments` /
`col_segments` one matrix packs several problems on its block diagonal, and
the per-problem conditions (the <= 2 tokens skip, the no-unaligned-left stop)
are evaluated per block, so the result equals itermax on each block alone.

Scores are meant to be nonnegative (Sinkhorn plans are), since the
reweighting multiplies them. A problem whose valid scores go below zero is
shifted by its minimum first, which keeps every argmax and makes the
reweighting do what it does for nonnegative scores; nonnegative problems are
left untouched. The argmaxes of the reweighted matrix are taken over the
cells that may still be linked; SimAlign takes them over the whole row and
drops links in fully aligned cells afterwards, which differs only when a
row's or column's best allowed score is exactly 0 (a tie with the zeroed
cells).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _mutual_argmax(values: jax.Array, valid: jax.Array) -> jax.Array:
  """Cells that are the argmax of their row and of their column.

  Args:
    values: [..., n, m] float32.
    valid: [..., n, m] bool; argmaxes are taken over valid cells only.

  Returns:
    [..., n, m] bool, False on invalid cells. Ties go to the first index, as
    with numpy's argmax.
  """
  values = jnp.where(valid, values, -jnp.inf)
  n, m = values.shape[-2:]
  row_best = jnp.argmax(values, axis=-1)  # [..., n]
  col_best = jnp.argmax(values, axis=-2)  # [..., m]
  is_row_best = row_best[..., :, None] == jnp.arange(m)
  is_col_best = col_best[..., None, :] == jnp.arange(n)[:, None]
  return is_row_best & is_col_best & valid


def argmax_intersection(scores: jax.Array, mask: jax.Array) -> jax.Array:
  """Mutual argmax alignment (SimAlign's ArgMax, itermax's first round).

  Args:
    scores: [..., n, m] scores (any float dtype).
    mask: [..., n, m] bool, True on valid entries.

  Returns:
    [..., n, m] bool: (i, j) where j is the argmax of row i and i the argmax
    of column j among valid entries; False on invalid entries and on rows or
    columns without valid entries.
  """
  scores = jnp.asarray(scores).astype(jnp.float32)
  mask = jnp.broadcast_to(jnp.asarray(mask, dtype=bool), scores.shape)
  return _mutual_argmax(scores, mask)


class _Blocks:
  """Per-row reductions over the problem (block) each row belongs to.

  Without segment ids the whole matrix is one problem per batch element.
  Results are [..., n], one value per row, for the block of that row.
  """

  def __init__(self, row_segments, col_segments):
    self._packed = row_segments is not None
    if self._packed:
      self._same_rows = row_segments[..., :, None] == row_segments[..., None, :]
      self._same_cols = row_segments[..., :, None] == col_segments[..., None, :]

  def count_rows(self, flags: jax.Array) -> jax.Array:
    """flags [..., n] bool -> [..., n] number of True rows in the block."""
    flags = flags.astype(jnp.float32)
    if not self._packed:
      return jnp.broadcast_to(jnp.sum(flags, -1, keepdims=True), flags.shape)
    return jnp.einsum("...ik,...k->...i", self._same_rows.astype(jnp.float32), flags)

  def count_cols(self, flags: jax.Array, num_rows: int) -> jax.Array:
    """flags [..., m] bool -> [..., n] number of True columns in the block."""
    flags = flags.astype(jnp.float32)
    if not self._packed:
      total = jnp.sum(flags, -1, keepdims=True)
      return jnp.broadcast_to(total, flags.shape[:-1] + (num_rows,))
    return jnp.einsum("...ij,...j->...i", self._same_cols.astype(jnp.float32), flags)

  def min_rows(self, values: jax.Array) -> jax.Array:
    """values [..., n] -> [..., n] minimum over the rows of the block."""
    if not self._packed:
      return jnp.broadcast_to(jnp.min(values, -1, keepdims=True), values.shape)
    return jnp.min(jnp.where(self._same_rows, values[..., None, :], jnp.inf), -1)


def itermax(
    scores: jax.Array,
    mask: jax.Array,
    *,
    alpha: float = 0.9,
    max_count: int = 2,
    row_segments: jax.Array | None = None,
    col_segments: jax.Array | None = None,
) -> jax.Array:
  """SimAlign's Itermax alignment, as used by XLM-Align (paper Eq. 7-9).

  Args:
    scores: [..., n, m] scores, nonnegative in intended use (e.g. a Sinkhorn
      plan); problems with negative valid scores are shifted by their minimum.
    mask: [..., n, m] bool, True on valid entries. With segments it must be
      False off the diagonal blocks (row segment != column segment).
    alpha: down-weighting of cells whose row or column is already aligned.
    max_count: total number of rounds, static (1 = argmax intersection).
    row_segments: optional [..., n] int problem id of each row.
    col_segments: optional [..., m] int problem id of each column.

  Returns:
    [..., n, m] bool alignment, False on invalid entries.

  Raises:
    ValueError: only one of `row_segments`, `col_segments` given.
  """
  if (row_segments is None) != (col_segments is None):
    raise ValueError("give both row_segments and col_segments, or neither")
  scores = jnp.asarray(scores).astype(jnp.float32)
  mask = jnp.broadcast_to(jnp.asarray(mask, dtype=bool), scores.shape)
  n = scores.shape[-2]
  blocks = _Blocks(row_segments, col_segments)
  row_real = jnp.any(mask, axis=-1)
  col_real = jnp.any(mask, axis=-2)

  # Shift problems with negative scores to a minimum of 0 (see module doc);
  # the shift is constant over each block, so argmaxes do not move.
  row_min = jnp.min(jnp.where(mask, scores, jnp.inf), axis=-1)
  shift = jnp.minimum(blocks.min_rows(row_min), 0.0)
  scores = jnp.where(mask, scores - shift[..., :, None], 0.0)

  aligned = _mutual_argmax(scores, mask)
  if max_count <= 1:
    return aligned
  big_enough = jnp.minimum(blocks.count_rows(row_real),
                           blocks.count_cols(col_real, n)) > 2

  def refine(aligned, _):
    row_free = row_real & ~jnp.any(aligned, axis=-1)  # [..., n]
    col_free = col_real & ~jnp.any(aligned, axis=-2)  # [..., m]
    row_w = alpha * row_free.astype(jnp.float32)[..., :, None]
    col_w = alpha * col_free.astype(jnp.float32)[..., None, :]
    weight = jnp.clip(row_w + col_w, 0.0, 1.0)
    allowed = mask & (row_free[..., :, None] | col_free[..., None, :])
    new = _mutual_argmax(scores * weight, allowed)
    active = (big_enough
              & (blocks.count_rows(row_free) > 0)
              & (blocks.count_cols(col_free, n) > 0))
    return aligned | (new & active[..., :, None]), None

  aligned, _ = jax.lax.scan(refine, aligned, None, length=max_count - 1)
  return aligned
