"""Word alignments from a score matrix: argmax intersection and itermax.

`itermax` is SimAlign's Itermax (Jalili Sabet et al., 2020, `iter_max`),
which XLM-Align (Chi et al., 2021) applies to its Sinkhorn plans, with
SimAlign's settings `alpha = 0.9, max_count = 2`:

1. Align (i, j) when j is the argmax of row i and i the argmax of column j.
2. Unless the problem has at most 2 real rows or columns, repeat up to
   `max_count - 1` times: weight the scores by `clip(alpha * unaligned_row +
   alpha * unaligned_col, 0, 1)` (1 where both row i and column j are still
   unaligned, alpha where one is, 0 where neither is), take the mutual
   argmaxes of the weighted matrix over whole rows and columns, and add those
   whose row or column is still unaligned. A problem with no unaligned row or
   no unaligned column left adds nothing, and a round that adds nothing
   leaves every later round identical, so a fixed number of rounds gives
   SimAlign's early-stopping result.

The reweighting follows SimAlign and the released XLM-Align code (which calls
SimAlign's `iter_max` verbatim), not the paper's Eq. (9): Eq. (9) zeroes only
the linked cells and multiplies by alpha every cell sharing a row or a column
with a link, so a cell whose row and column are both linked (but not to each
other) keeps alpha there and 0 here, and a fresh cell keeps 1 in both.

Batching: any leading axes are batch axes and padding is given by `mask`; the
result equals SimAlign on each unpadded problem. With `row_segments` /
`col_segments` one matrix packs several problems on its block diagonal, and
the per-problem conditions (the <= 2 tokens skip, the no-unaligned-left stop)
are evaluated per block, so the result equals itermax on each block alone.

Scores are meant to be nonnegative (Sinkhorn plans, SimAlign's `(cos + 1) /
2`), since the reweighting multiplies them: an additive offset changes which
cells win the later rounds. A problem whose valid scores go below zero is
shifted by its minimum first, which keeps every argmax and makes the
reweighting do what it does for nonnegative scores (a variant: SimAlign
never sees negative scores); nonnegative problems are left untouched.

Ties: numpy's argmax takes the first index, which makes a tie a positional
bias (a saturated Sinkhorn plan has bit-identical entries). `tie_break`
gives a second score (e.g. the raw similarity) that decides exact ties
first; only cells tied on both go to the first index.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _argmax(values: jax.Array, valid: jax.Array, tie_break: jax.Array | None, axis: int) -> jax.Array:
  """Index of the largest valid value along `axis`; exact ties go to the largest
  `tie_break`, then to the first index (numpy's rule)."""
  values = jnp.where(valid, values, -jnp.inf)
  if tie_break is None:
    return jnp.argmax(values, axis=axis)
  tied = valid & (values == jnp.max(values, axis=axis, keepdims=True))
  return jnp.argmax(jnp.where(tied, tie_break, -jnp.inf), axis=axis)


def _mutual_argmax(row_values: jax.Array, valid: jax.Array, *, col_values: jax.Array | None = None,
                   tie_break: jax.Array | None = None) -> jax.Array:
  """Cells that are the argmax of their row and of their column.

  Args:
    row_values: [..., n, m] float32, argmaxed along rows (forward links).
    valid: [..., n, m] bool; argmaxes are taken over valid cells only.
    col_values: [..., n, m] argmaxed along columns (backward links);
      default `row_values`.
    tie_break: optional [..., n, m] second key for exact ties.

  Returns:
    [..., n, m] bool, False on invalid cells.
  """
  col_values = row_values if col_values is None else col_values
  n, m = row_values.shape[-2:]
  row_best = _argmax(row_values, valid, tie_break, axis=-1)  # [..., n]
  col_best = _argmax(col_values, valid, tie_break, axis=-2)  # [..., m]
  is_row_best = row_best[..., :, None] == jnp.arange(m)
  is_col_best = col_best[..., None, :] == jnp.arange(n)[:, None]
  return is_row_best & is_col_best & valid


def argmax_intersection(scores: jax.Array, mask: jax.Array, *, col_scores: jax.Array | None = None,
                        tie_break: jax.Array | None = None) -> jax.Array:
  """Mutual argmax alignment (SimAlign's ArgMax, itermax's first round).

  Args:
    scores: [..., n, m] scores (any float dtype).
    mask: [..., n, m] bool, True on valid entries.
    col_scores: optional [..., n, m] scores for the column argmaxes (the
      released XLM-Align aligner takes rows from one Sinkhorn iterate and
      columns from another); default `scores`.
    tie_break: optional [..., n, m] second key deciding exact ties (e.g. the
      raw similarity when `scores` is a plan); then the first index wins.

  Returns:
    [..., n, m] bool: (i, j) where j is the argmax of row i and i the argmax
    of column j among valid entries; False on invalid entries and on rows or
    columns without valid entries.
  """
  scores = jnp.asarray(scores).astype(jnp.float32)
  mask = jnp.broadcast_to(jnp.asarray(mask, dtype=bool), scores.shape)
  if col_scores is not None:
    col_scores = jnp.asarray(col_scores).astype(jnp.float32)
  if tie_break is not None:
    tie_break = jnp.asarray(tie_break).astype(jnp.float32)
  return _mutual_argmax(scores, mask, col_values=col_scores, tie_break=tie_break)


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
    tie_break: jax.Array | None = None,
) -> jax.Array:
  """SimAlign's Itermax alignment, as XLM-Align's released code runs it.

  Args:
    scores: [..., n, m] scores, nonnegative in intended use (e.g. a Sinkhorn
      plan); problems with negative valid scores are shifted by their minimum.
    mask: [..., n, m] bool, True on valid entries. With segments it must be
      False off the diagonal blocks (row segment != column segment).
    alpha: down-weighting of cells whose row or column is already aligned.
    max_count: total number of rounds, static (1 = argmax intersection).
    row_segments: optional [..., n] int problem id of each row.
    col_segments: optional [..., m] int problem id of each column.
    tie_break: optional [..., n, m] second key deciding exact ties of every
      round's argmaxes (e.g. the raw similarity when `scores` is a plan).

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

  if tie_break is not None:
    tie_break = jnp.asarray(tie_break).astype(jnp.float32)
  aligned = _mutual_argmax(scores, mask, tie_break=tie_break)
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
    # SimAlign's argmaxes run over whole rows and columns (fully aligned
    # cells weigh 0 there), and only then are links restricted to cells with
    # a free row or column.
    allowed = row_free[..., :, None] | col_free[..., None, :]
    new = _mutual_argmax(scores * weight, mask, tie_break=tie_break) & allowed
    active = (big_enough
              & (blocks.count_rows(row_free) > 0)
              & (blocks.count_cols(col_free, n) > 0))
    return aligned | (new & active[..., :, None]), None

  aligned, _ = jax.lax.scan(refine, aligned, None, length=max_count - 1)
  return aligned
