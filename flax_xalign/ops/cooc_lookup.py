"""Sparse co-occurrence lookup on device: log X[a, b] for a batch of (a, b) pairs.

The table is CSR over the centre token a (the `cooc` asset's device value):

    indptr  int32   [V + 1]  row a holds entries indptr[a] .. indptr[a + 1] - 1
    indices int32   [nnz]    column b of each entry, strictly increasing within a row
    log_x   float32 [nnz]    log X[a, b] (X > 0; absent pairs have X = 0 and no entry)

`lookup` finds each query's column by a binary search inside its row's range,
vectorised over any query shape: every query runs the same fixed number of
halving steps, `search_steps(nnz, V)` (a row holds at most min(nnz, V)
entries), so the loop has a static trip count and needs no data-dependent
control flow; jit, vmap and sharded queries work unchanged. Everything is int32
(JAX runs with x64 off), which is why the table is CSR and not one sorted array
of flat keys a * V + b: those overflow int32 once V > 46,340 (XLM-R's 250k
pieces), while CSR offsets only need nnz < 2**31.

Memory: one [query] int32 carry of each bound and one gather of `indices` per
step; the table itself is read-only and replicated (see `assets/cooc.py`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class CoocLookup(NamedTuple):
  """Result of `lookup`, both of the queries' shape.

  Attributes:
    log_x: float32 log X[a, b] where found, 0.0 elsewhere.
    found: bool, True where the table has the pair (X > 0).
  """

  log_x: jax.Array
  found: jax.Array


def search_steps(nnz: int, vocab_size: int) -> int:
  """Halving steps that narrow any row's range to one position.

  A row holds at most L = min(nnz, V) entries (its columns are distinct), and
  a lower-bound search over a range of L positions ends after ceil(log2(L + 1))
  halvings: each step leaves at most floor(length / 2) candidates.
  """
  longest = max(0, min(int(nnz), int(vocab_size)))
  return max(1, math.ceil(math.log2(longest + 1)))


def lookup(indptr: jax.Array, indices: jax.Array, log_x: jax.Array, rows: jax.Array, cols: jax.Array, *,
           unroll: bool | None = None) -> CoocLookup:
  """log X[rows, cols] from a CSR table, for queries of any shape.

  Args:
    indptr: int32 [V + 1] row offsets (nondecreasing, indptr[0] = 0, indptr[V] = nnz).
    indices: int32 [nnz] columns, strictly increasing within each row; nnz >= 1.
    log_x: float32 [nnz] values.
    rows: int [...] centre token ids a.
    cols: int [...] context token ids b, the shape of `rows`.
    unroll: unroll the halving loop (static). None: unrolled except on the
      CPU backend, JAX's own advice for `searchsorted` ('scan_unrolled' is
      faster on GPU, 'scan' on CPU): unrolled, the search can fuse into one
      kernel instead of a loop of launches; on CPU the rolled loop measured
      ~2x faster (bench/cooc_lookup.py). The result is identical.

  Returns:
    CoocLookup(log_x float32 [...], found bool [...]); ids outside [0, V) are
    not found (so padding ids need no special care beyond having no entries).
  """
  rows = jnp.asarray(rows)
  cols = jnp.asarray(cols)
  if rows.shape != cols.shape:
    raise ValueError(f"rows and cols must have the same shape, got {rows.shape} and {cols.shape}")
  vocab_size = indptr.shape[0] - 1
  nnz = indices.shape[0]
  if nnz < 1:
    raise ValueError("the table has no entries (nnz = 0); the cooc asset refuses empty tables")
  indptr = jnp.asarray(indptr, jnp.int32)
  indices = jnp.asarray(indices, jnp.int32)
  log_x = jnp.asarray(log_x)
  rows = rows.astype(jnp.int32)
  cols = cols.astype(jnp.int32)
  in_range = (rows >= 0) & (rows < vocab_size)
  safe_rows = jnp.where(in_range, rows, 0)
  start = _gather(indptr, safe_rows)
  end = jnp.where(in_range, _gather(indptr, safe_rows + 1), start)
  last = nnz - 1

  def halve(_, bounds):
    # Lower bound: the first position in [lo, hi) whose column is >= cols. The midpoint is lo + (hi - lo) / 2
    # by a logical shift (hi >= lo): lo + hi may pass 2**31 near the int32 limit, and a shift is cheaper than
    # a signed floor division. A finished search (lo == hi) stays put; its mid may be nnz, hence the clamp.
    lo, hi = bounds
    mid = lo + jax.lax.shift_right_logical(hi - lo, 1)
    right = (lo < hi) & (_gather(indices, jnp.minimum(mid, last)) < cols)
    return jnp.where(right, mid + 1, lo), jnp.where(right, hi, mid)

  if unroll is None:
    unroll = jax.default_backend() != "cpu"
  position, _ = jax.lax.fori_loop(0, search_steps(nnz, vocab_size), halve, (start, end),
                                  unroll=bool(unroll))
  clamped = jnp.minimum(position, last)
  found = (position < end) & (_gather(indices, clamped) == cols)
  values = jnp.where(found, _gather(log_x, clamped).astype(jnp.float32), 0.0)
  return CoocLookup(log_x=values, found=found)


def _gather(array: jax.Array, index: jax.Array) -> jax.Array:
  # Every index is clamped into range by the caller: no bounds handling in the gather.
  return array.at[index].get(mode="promise_in_bounds")


def lookup_table(table: Mapping[str, jax.Array], rows: jax.Array, cols: jax.Array) -> CoocLookup:
  """`lookup` on the `cooc` asset's device value (`ctx.assets['cooc']`)."""
  return lookup(table["indptr"], table["indices"], table["log_x"], rows, cols)


def csr_from_pairs(pairs: Mapping[tuple[int, int], float],
                   vocab_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """CSR arrays (int32 indptr [V + 1], int32 indices [nnz], float32 log_x [nnz]) of {(a, b): X}.

  For tests and benches. Pairs with X == 0 are left out (absent means X = 0);
  negative or non-finite X, or ids outside [0, vocab_size), raise ValueError.
  """
  if not pairs:
    return np.zeros(vocab_size + 1, np.int32), np.zeros(0, np.int32), np.zeros(0, np.float32)
  keys = np.asarray(list(pairs), np.int64).reshape(-1, 2)
  values = np.asarray(list(pairs.values()), np.float64)
  if not np.all(np.isfinite(values)) or (values < 0).any():
    raise ValueError("co-occurrence values must be finite and >= 0")
  if keys.min() < 0 or keys.max() >= vocab_size:
    raise ValueError(f"token ids must lie in [0, {vocab_size})")
  keep = values > 0
  keys, values = keys[keep], values[keep]
  order = np.lexsort((keys[:, 1], keys[:, 0]))
  keys, values = keys[order], values[order]
  indptr = np.zeros(vocab_size + 1, np.int64)
  np.cumsum(np.bincount(keys[:, 0], minlength=vocab_size), out=indptr[1:])
  if indptr[-1] >= 2**31:
    raise ValueError(f"{indptr[-1]:,} entries do not fit int32 offsets")
  return indptr.astype(np.int32), keys[:, 1].astype(np.int32), np.log(values).astype(np.float32)
