"""Blockwise cosine top-k, nearest neighbours and CSLS between two embedding sets, never the full matrix.

CSLS (cross-domain similarity local scaling; Conneau et al. 2018, MUSE's
`csls_knn_10`; Lu et al. 2023 Eq. 1-2 induce their dictionaries with it)
rescores a cosine by how crowded both ends are:

  CSLS(x, y) = 2 cos(x, y) - r_K(x) - r_K(y),

with r_K(x) the mean of the K (default 10) highest cosines between x and the
other set, so that "hubs", vectors near everything, stop being everybody's
nearest neighbour.

Problem: two sets of vectors, `queries`/`sources` [q, e] and `targets` [t, e],
any float dtype, unit-normalised inside with `ops.similarity.l2_normalize`
(zero rows stay zero: cosine 0 with everything), and optional bool masks for
the padded rows of capacity-padded vocabularies. Solver: `block` query rows
at a time (`lax.fori_loop`), one [block, t] cosine matmul each, so memory is
O(block x t); static `k`/`knn`/`block`/`approx`, so everything jits and vmaps.
Result: `TopK`, values descending with their target row indices.

Exact top-k (the default) per block: `lax.top_k` over all t columns costs
more than the matmul on CPU (it is a per-row selection over 50k values), so
the columns are cut into chunks of `_CHUNK`; one fused pass takes each
chunk's maximum, the k best chunks of a row are the only ones that can hold
its top k (a chunk outside them has k chunks above its best entry, hence k
entries above all of its entries), and the final `lax.top_k` runs over those
k x `_CHUNK` gathered scores. Chunk ties go to the lower chunk and the chosen
chunks are gathered in column order, so score ties resolve to the lower
target index, as in `lax.top_k`. `approx=True` takes `lax.approx_max_k`
(with `recall_target`) over the whole row instead: TPU's fast path, where
ties and recall are what that primitive gives.

CSLS top-k needs r_K(y) for every target before any row can be ranked; the
ranking itself ignores r_K(x), a per-row constant. So `csls_topk` makes two
passes: blocks of targets against all sources give r_K(y); then blocks of
sources against all targets give, from the same cosine block, both r_K(x)
(the top-knn cosines) and the top-k of `2 cos - r_K(y)`. Two matmuls over
[s, t] instead of the three of the usual recipe (two kNN searches, then a
search for CSLS).

Masks: masked targets are never returned; a row whose valid targets number
fewer than k gets -inf / -1 in its last columns; masked query rows get -inf /
-1 throughout and radius 0. r_K averages the min(K, n_valid) highest cosines
(0 when there is no valid neighbour). Matmuls run at `Precision.HIGHEST` on
the exact path (no TF32/bf16 passes on accelerators; CPU is float32 either
way) and at the backend's default with `approx=True`.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from flax_xalign.errors import UserError
from flax_xalign.ops.similarity import l2_normalize

# Target columns per chunk of the exact top-k. 128 keeps the gathered
# k x _CHUNK candidates small (1280 of a 50k row at k=10) and the chunk
# maxima few (t / 128); 32..512 measured within 10% on a 2-core CPU.
_CHUNK = 128


class TopK(NamedTuple):
  """The k best targets of each query row.

  Attributes:
    values: [q, k] float32, descending; -inf where a row has fewer than k
      valid targets (and on masked query rows).
    indices: [q, k] int32 row indices into `targets`; -1 where `values` is -inf.
  """

  values: jax.Array
  indices: jax.Array


class _Head(NamedTuple):
  """One top-k taken from each cosine block: of `scale * cos - bias` (bias [t] or None)."""

  k: int
  scale: float


def _check(name: str, value: int, minimum: int = 1) -> None:
  if not isinstance(value, int) or value < minimum:
    raise UserError(f"ops.csls: {name} must be an integer >= {minimum}, got {value!r}; pass e.g. {name}=10.")


def _valid(mask: jax.Array | None, n: int) -> jax.Array:
  if mask is None:
    return jnp.ones((n,), bool)
  mask = jnp.asarray(mask)
  if mask.shape != (n,):
    raise UserError(f"ops.csls: a mask must have shape ({n},) like its vectors' rows, got {mask.shape}; "
                    "pass one bool per row (True = a real row).")
  return mask.astype(bool)


def _vectors(x: jax.Array, name: str) -> jax.Array:
  x = jnp.asarray(x)
  if x.ndim != 2 or not jnp.issubdtype(x.dtype, jnp.floating):
    raise UserError(f"ops.csls: {name} must be a [rows, embed] float array, got {x.dtype}{list(x.shape)}; "
                    "vmap over any leading axes.")
  return x


class _Set(NamedTuple):
  """A vector set ready to search: unit rows, padded (masked) to `columns(...)` rows; `size` = real rows."""

  unit: jax.Array  # [rows, e] float32
  valid: jax.Array  # [rows] bool
  size: int


def _columns(t: int, ks: tuple[int, ...], approx: bool) -> int:
  """Rows a target set is padded to: at least max(ks), whole chunks where some head chunks."""
  columns = max(t, *ks)
  if not approx and columns > 2 * min(ks) * _CHUNK:
    columns = -(-columns // _CHUNK) * _CHUNK
  return columns


def _prepare(x: jax.Array, valid: jax.Array, rows: int) -> _Set:
  # One normalised, padded copy per set (XLA fuses the pad into the normalisation): as targets its
  # padded rows are masked, as queries they are never read.
  extra = rows - x.shape[0]
  return _Set(jnp.pad(l2_normalize(x), ((0, extra), (0, 0))), jnp.pad(valid, (0, extra)), x.shape[0])


def _score(cos: jax.Array, scale: float, bias: jax.Array | None, valid: jax.Array) -> jax.Array:
  # scale is 1 or 2, so `scale * cos` is exact and every place that forms a
  # score (chunk maxima, gathered candidates) gets the same float.
  score = cos if scale == 1 else scale * cos
  if bias is not None:
    score = score - bias
  return jnp.where(valid, score, -jnp.inf)


def _row_topk(cos: jax.Array, head: _Head, bias: jax.Array | None, valid: jax.Array, *, approx: bool,
              recall_target: float) -> tuple[jax.Array, jax.Array]:
  """Top-k of one block's scores.

  Args:
    cos: [b, t] cosines, t a multiple of `_CHUNK` when t > 2 k `_CHUNK`.
    head: k and scale of the score.
    bias: [t] float32 or None.
    valid: [t] bool, the target mask.

  Returns:
    ([b, k] float32 values, [b, k] int32 indices), -1 where the value is -inf.
  """
  rows, t = cos.shape
  k = head.k
  if approx:
    values, index = jax.lax.approx_max_k(_score(cos, head.scale, bias, valid), k, recall_target=recall_target)
  elif t <= 2 * k * _CHUNK:
    values, index = jax.lax.top_k(_score(cos, head.scale, bias, valid), k)
  else:
    chunks = t // _CHUNK
    cos3 = cos.reshape(rows, chunks, _CHUNK)
    bias3 = None if bias is None else bias.reshape(chunks, _CHUNK)
    valid3 = valid.reshape(chunks, _CHUNK)
    best = jnp.max(_score(cos3, head.scale, bias3, valid3), axis=-1)  # [b, chunks]
    chosen = jnp.sort(jax.lax.top_k(best, k)[1], axis=-1)  # [b, k], in column order
    picked = jnp.take_along_axis(cos3, chosen[:, :, None], axis=1)  # [b, k, _CHUNK]
    picked = _score(picked, head.scale, None if bias3 is None else bias3[chosen], valid3[chosen])
    values, where = jax.lax.top_k(picked.reshape(rows, k * _CHUNK), k)
    index = jnp.take_along_axis(chosen, where // _CHUNK, axis=1) * _CHUNK + where % _CHUNK
  return values, jnp.where(values > -jnp.inf, index, -1).astype(jnp.int32)


def _search(queries: _Set, targets: _Set, heads: tuple[_Head, ...], biases: tuple[jax.Array | None, ...], *,
            block: int, approx: bool, recall_target: float) -> list[TopK]:
  """Every head's top-k of every query row, `block` query rows at a time.

  Blocks start at `min(i * block, q - block)`: the last one overlaps its
  predecessor and rewrites the shared rows with the same values, so the
  queries need no padding (and no copy).

  Args:
    queries: the query set (its first `size` rows are searched).
    targets: the target set, padded to `_columns(size, ks, approx)` rows.
    heads: static (k, scale) per requested top-k.
    biases: per head, [t] float32 subtracted from the scaled cosine, or None.

  Returns:
    One `TopK` per head, [q, k] each; masked query rows -inf / -1.
  """
  q = queries.size
  if q == 0:
    return [TopK(jnp.zeros((0, h.k), jnp.float32), jnp.zeros((0, h.k), jnp.int32)) for h in heads]
  columns = targets.unit.shape[0]
  biases = tuple(None if b is None else jnp.pad(b.astype(jnp.float32), (0, columns - b.shape[0])) for b in biases)
  block = min(block, q)
  precision = jax.lax.Precision.DEFAULT if approx else jax.lax.Precision.HIGHEST

  def one_block(step, out):
    start = jnp.minimum(step * block, q - block)
    xb = jax.lax.dynamic_slice_in_dim(queries.unit, start, block)
    vb = jax.lax.dynamic_slice_in_dim(queries.valid, start, block)[:, None]
    cos = jnp.matmul(xb, targets.unit.T, precision=precision)  # [block, columns]
    new = []
    for (all_values, all_index), head, bias in zip(out, heads, biases):
      values, index = _row_topk(cos, head, bias, targets.valid, approx=approx, recall_target=recall_target)
      new.append((jax.lax.dynamic_update_slice_in_dim(all_values, jnp.where(vb, values, -jnp.inf), start, 0),
                  jax.lax.dynamic_update_slice_in_dim(all_index, jnp.where(vb, index, -1), start, 0)))
    return new

  init = [(jnp.full((q, h.k), -jnp.inf, jnp.float32), jnp.full((q, h.k), -1, jnp.int32)) for h in heads]
  out = jax.lax.fori_loop(0, -(-q // block), one_block, init)
  return [TopK(values, index) for values, index in out]


def _mean_of_finite(values: jax.Array) -> jax.Array:
  """[q, k] -> [q]: mean of the finite entries of each row, 0 where there are none."""
  finite = values > -jnp.inf
  total = jnp.sum(jnp.where(finite, values, 0.0), axis=-1)
  return total / jnp.maximum(jnp.sum(finite, axis=-1), 1).astype(jnp.float32)


@functools.partial(jax.jit, static_argnames=("k", "block", "approx", "recall_target"))
def cosine_topk(queries: jax.Array, targets: jax.Array, *, k: int, query_mask: jax.Array | None = None,
                target_mask: jax.Array | None = None, block: int = 1024, approx: bool = False,
                recall_target: float = 0.95) -> TopK:
  """The k targets of highest cosine for each query row.

  Args:
    queries: [q, e] float vectors.
    targets: [t, e] float vectors.
    k: how many neighbours per row (static; may exceed t: the rest is -inf / -1).
    query_mask: optional [q] bool, True = a real row; masked rows get -inf / -1.
    target_mask: optional [t] bool; masked targets are never returned.
    block: query rows per cosine block (memory ~ block x t float32).
    approx: `lax.approx_max_k` instead of the exact top-k (TPU).
    recall_target: `approx_max_k`'s recall target.

  Returns:
    TopK: [q, k] cosines, descending (lower target index first on ties), and
    their target indices.
  """
  _check("k", k)
  _check("block", block)
  queries, targets = _vectors(queries, "queries"), _vectors(targets, "targets")
  q, t = queries.shape[0], targets.shape[0]
  x = _prepare(queries, _valid(query_mask, q), q)
  y = _prepare(targets, _valid(target_mask, t), _columns(t, (k,), approx))
  (top,) = _search(x, y, (_Head(k, 1),), (None,), block=block, approx=approx, recall_target=recall_target)
  return top


@functools.partial(jax.jit, static_argnames=("block",))
def nearest_neighbours(table: jax.Array, queries: jax.Array, candidates: jax.Array, *,
                       block: int = 1024) -> jax.Array:
  """Cosine nearest neighbour among `candidates` for each query id: `cosine_topk` at k = 1.

  Searching `block` query rows at a time keeps the [queries, candidates]
  similarity matrix of a large vocabulary from ever existing at once.

  Args:
    table: [vocab, embed] embeddings.
    queries: [q] int ids (rows of `table`).
    candidates: [c] int ids (rows of `table`).
    block: query rows per similarity block.

  Returns:
    [q] int32: the candidate id nearest to each query (the first on ties).
  """
  top = cosine_topk(table[queries], table[candidates], k=1, block=block)
  return candidates[top.indices[:, 0]].astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("knn", "block", "approx"))
def neighbourhood_radius(queries: jax.Array, targets: jax.Array, *, knn: int = 10,
                         target_mask: jax.Array | None = None, query_mask: jax.Array | None = None,
                         block: int = 1024, approx: bool = False) -> jax.Array:
  """r_K: each query's mean cosine to its `knn` nearest targets.

  Args:
    queries: [q, e] float vectors.
    targets: [t, e] float vectors.
    knn: K (static).
    target_mask, query_mask: optional [t] / [q] bool, True = a real row.
    block, approx: as in `cosine_topk`.

  Returns:
    [q] float32: the mean of the min(knn, n_valid_targets) highest cosines;
    0 on masked query rows and when no target is valid.
  """
  _check("knn", knn)
  top = cosine_topk(queries, targets, k=knn, query_mask=query_mask, target_mask=target_mask, block=block,
                    approx=approx)
  return _mean_of_finite(top.values)


@functools.partial(jax.jit, static_argnames=("k", "knn", "block", "approx"))
def csls_topk(sources: jax.Array, targets: jax.Array, *, k: int = 1, knn: int = 10,
              source_mask: jax.Array | None = None, target_mask: jax.Array | None = None, block: int = 1024,
              approx: bool = False) -> TopK:
  """The k targets of highest CSLS for each source row.

  Args:
    sources: [s, e] float vectors.
    targets: [t, e] float vectors.
    k: neighbours per source (static).
    knn: K of the radii r_K (static); r_K(x) over the valid targets, r_K(y)
      over the valid sources.
    source_mask, target_mask: optional [s] / [t] bool, True = a real row.
    block: rows per cosine block in both passes.
    approx: `lax.approx_max_k` for every top-k (TPU).

  Returns:
    TopK: [s, k] CSLS values `2 cos - r_K(x) - r_K(y)`, descending (lower
    target index first on ties), and their target indices.
  """
  _check("k", k)
  _check("knn", knn)
  _check("block", block)
  sources, targets = _vectors(sources, "sources"), _vectors(targets, "targets")
  s, t = sources.shape[0], targets.shape[0]
  x = _prepare(sources, _valid(source_mask, s), _columns(s, (knn,), approx))
  y = _prepare(targets, _valid(target_mask, t), _columns(t, (knn, k), approx))
  search = functools.partial(_search, block=block, approx=approx, recall_target=0.95)
  (target_knn,) = search(y, x, (_Head(knn, 1),), (None,))
  target_radius = _mean_of_finite(target_knn.values)
  source_knn, top = search(x, y, (_Head(knn, 1), _Head(k, 2)), (None, target_radius))
  values = top.values - _mean_of_finite(source_knn.values)[:, None]  # -inf stays -inf
  return TopK(values, top.indices)


@functools.partial(jax.jit, static_argnames=("knn",))
def csls_matrix(sources: jax.Array, targets: jax.Array, *, knn: int = 10, source_mask: jax.Array | None = None,
                target_mask: jax.Array | None = None) -> jax.Array:
  """Dense CSLS between two small sets (on-the-fly SCS inside a train step).

  Args:
    sources: [s, e] float vectors.
    targets: [t, e] float vectors.
    knn: K of the radii (static), as in `csls_topk`.
    source_mask, target_mask: optional [s] / [t] bool, True = a real row.

  Returns:
    [s, t] float32 `2 cos - r_K(x) - r_K(y)`; -inf where either row is masked.
  """
  _check("knn", knn)
  sources, targets = _vectors(sources, "sources"), _vectors(targets, "targets")
  s, t = sources.shape[0], targets.shape[0]
  source_valid, target_valid = _valid(source_mask, s), _valid(target_mask, t)
  cos = jnp.matmul(l2_normalize(sources), l2_normalize(targets).T, precision=jax.lax.Precision.HIGHEST)
  pair_valid = source_valid[:, None] & target_valid[None, :]
  masked = jnp.where(pair_valid, cos, -jnp.inf)

  def radius(rows: jax.Array) -> jax.Array:  # [n, m] masked cosines -> [n] r_K
    top = jax.lax.top_k(jnp.pad(rows, ((0, 0), (0, max(0, knn - rows.shape[1]))), constant_values=-jnp.inf), knn)
    return _mean_of_finite(top[0])

  csls = 2.0 * cos - radius(masked)[:, None] - radius(masked.T)[None, :]
  return jnp.where(pair_valid, csls, -jnp.inf)
