"""Blockwise cosine top-k / CSLS against brute-force float64 NumPy (MUSE's recipe), with the edges."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_xalign import ops
from flax_xalign.errors import UserError

ATOL = 2e-5  # float32 matmul vs float64


# ----- the reference, written from the definitions -----

def ref_cosine(x, y):
  """float64 [q, t] cosines; rows scaled by 1 / max(norm, 1e-6) (zero rows stay zero)."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-6)
  y = y / np.maximum(np.linalg.norm(y, axis=1, keepdims=True), 1e-6)
  return x @ y.T


def ref_topk(scores, k, target_valid=None, query_valid=None):
  """Per row: valid targets by descending score, lower index first on ties; -inf / -1 padding."""
  q, t = scores.shape
  target_valid = np.ones(t, bool) if target_valid is None else np.asarray(target_valid)
  query_valid = np.ones(q, bool) if query_valid is None else np.asarray(query_valid)
  values, indices = np.full((q, k), -np.inf), np.full((q, k), -1)
  for i in range(q):
    if not query_valid[i]:
      continue
    cols = np.flatnonzero(target_valid)
    order = cols[np.lexsort((cols, -scores[i, cols]))][:k]
    values[i, :len(order)], indices[i, :len(order)] = scores[i, order], order
  return values, indices


def ref_radius(cos, knn, target_valid=None, query_valid=None):
  """MUSE: r = mean of the knn highest cosines (here over min(knn, n_valid); 0 when none)."""
  values, _ = ref_topk(cos, knn, target_valid, query_valid)
  finite = np.isfinite(values)
  return np.where(finite, values, 0).sum(1) / np.maximum(finite.sum(1), 1)


def ref_csls(x, y, knn, source_valid=None, target_valid=None):
  cos = ref_cosine(x, y)
  r_x = ref_radius(cos, knn, target_valid, source_valid)
  r_y = ref_radius(cos.T, knn, source_valid, target_valid)
  return 2 * cos - r_x[:, None] - r_y[None, :]


def assert_topk(top, scores, k, target_valid=None, query_valid=None, atol=ATOL):
  """Values match the reference's; every index is valid, distinct and scores its value; indices
  match the reference wherever the reference value is not within atol of another candidate's."""
  values, indices = np.asarray(top.values, np.float64), np.asarray(top.indices)
  assert values.shape == indices.shape == (scores.shape[0], k)
  assert top.values.dtype == jnp.float32 and top.indices.dtype == jnp.int32
  ref_values, ref_indices = ref_topk(scores, k, target_valid, query_valid)
  np.testing.assert_array_equal(indices == -1, ref_indices == -1)
  np.testing.assert_array_equal(np.isinf(values), np.isinf(ref_values))
  finite = np.isfinite(ref_values)
  np.testing.assert_allclose(values[finite], ref_values[finite], atol=atol, rtol=0)
  valid = np.ones(scores.shape[1], bool) if target_valid is None else np.asarray(target_valid)
  for i in range(scores.shape[0]):
    got = indices[i][indices[i] >= 0]
    assert len(set(got)) == len(got) and valid[got].all()
    np.testing.assert_allclose(scores[i, got], values[i, :len(got)], atol=atol, rtol=0)
    row = np.sort(scores[i, valid])[::-1]
    for j, (ref_value, ref_index) in enumerate(zip(ref_values[i], ref_indices[i])):
      if ref_index >= 0 and np.sum(np.abs(row - ref_value) <= 2 * atol) == 1:
        assert indices[i, j] == ref_index, (i, j)


def _data(seed, *shape_sets, dtype=np.float32):
  rng = np.random.default_rng(seed)
  return [rng.normal(size=shape).astype(dtype) for shape in shape_sets]


# (queries, targets, embed, k, knn, block): blocks that do not divide q, block > q, length-1
# sets, k > t, and t large enough (> 2 k 128) for the chunked exact top-k, not a multiple of 128.
SIZES = [
    (13, 11, 24, 3, 4, 5),
    (7, 5, 8, 6, 10, 64),
    (1, 1, 8, 1, 1, 4),
    (1, 9, 8, 2, 3, 1),
    (9, 1, 8, 2, 2, 4),
    (29, 700, 16, 2, 3, 8),
    (6, 1500, 12, 4, 10, 4),
]


# Every size runs in one of the two tests below in the unit tier, both tests on every size in the slow tier.
_COSINE_FAST = {(13, 11), (1, 9), (1, 1), (6, 1500)}  # blocks not dividing q, length-1 sides, chunked top-k
_CSLS_FAST = {(7, 5), (9, 1), (29, 700)}  # k > t and block > q, one target, chunked top-k


@pytest.mark.fast(lambda p: (p["q"], p["t"]) in _COSINE_FAST)
@pytest.mark.parametrize("q,t,e,k,knn,block", SIZES)
def test_cosine_topk_and_radius_match_brute_force(q, t, e, k, knn, block):
  x, y = _data(q * 1000 + t, (q, e), (t, e))
  cos = ref_cosine(x, y)
  assert_topk(ops.cosine_topk(x, y, k=k, block=block), cos, k)
  radius = ops.neighbourhood_radius(x, y, knn=knn, block=block)
  assert radius.shape == (q,) and radius.dtype == jnp.float32
  np.testing.assert_allclose(radius, ref_radius(cos, knn), atol=ATOL)


@pytest.mark.fast(lambda p: (p["q"], p["t"]) in _CSLS_FAST)
@pytest.mark.parametrize("q,t,e,k,knn,block", SIZES)
def test_csls_topk_matches_brute_force(q, t, e, k, knn, block):
  x, y = _data(q * 7 + t, (q, e), (t, e))
  assert_topk(ops.csls_topk(x, y, k=k, knn=knn, block=block), ref_csls(x, y, knn), k, atol=4 * ATOL)


def test_masks_padding_rows_and_knn_above_valid_count():
  q, t, e = 17, 650, 16
  x, y = _data(3, (q, e), (t, e))
  rng = np.random.default_rng(4)
  source_valid, target_valid = rng.random(q) < 0.7, rng.random(t) < 0.6
  source_valid[[0, 5]] = False  # all-masked query rows
  # Garbage in padded rows must not matter.
  x[~source_valid] *= 1e3
  y[~target_valid] = 7.0
  cos = ref_cosine(x, y)
  top = ops.cosine_topk(x, y, k=3, query_mask=source_valid, target_mask=target_valid, block=4)
  assert_topk(top, cos, 3, target_valid, source_valid)
  radius = ops.neighbourhood_radius(x, y, knn=5, query_mask=source_valid, target_mask=target_valid)
  np.testing.assert_allclose(radius, ref_radius(cos, 5, target_valid, source_valid), atol=ATOL)
  assert np.all(np.asarray(radius)[~source_valid] == 0)
  csls = ref_csls(x, y, 5, source_valid, target_valid)
  top = ops.csls_topk(x, y, k=2, knn=5, source_mask=source_valid, target_mask=target_valid, block=6)
  assert_topk(top, csls, 2, target_valid, source_valid, atol=4 * ATOL)
  # knn above the number of valid targets: r_K averages the valid ones; k above it pads with -inf / -1.
  few = np.zeros(t, bool)
  few[[3, 100, 640]] = True
  np.testing.assert_allclose(ops.neighbourhood_radius(x, y, knn=10, target_mask=few),
                             ref_radius(cos, 10, few), atol=ATOL)
  top = ops.csls_topk(x, y, k=5, knn=10, target_mask=few)
  assert_topk(top, ref_csls(x, y, 10, None, few), 5, few, atol=4 * ATOL)
  assert np.all(np.asarray(top.indices)[:, 3:] == -1) and np.all(np.isneginf(np.asarray(top.values)[:, 3:]))


def test_no_valid_target_or_source():
  x, y = _data(5, (4, 8), (6, 8))
  none = np.zeros(6, bool)
  top = ops.cosine_topk(x, y, k=2, target_mask=none)
  assert np.all(np.asarray(top.indices) == -1) and np.all(np.isneginf(np.asarray(top.values)))
  np.testing.assert_array_equal(ops.neighbourhood_radius(x, y, knn=3, target_mask=none), np.zeros(4))
  top = ops.csls_topk(x, y, k=2, knn=3, source_mask=np.zeros(4, bool))
  assert np.all(np.asarray(top.indices) == -1)
  empty = ops.cosine_topk(np.zeros((0, 8), np.float32), y, k=2)
  assert empty.values.shape == (0, 2) and empty.indices.shape == (0, 2)
  top = ops.cosine_topk(x, np.zeros((0, 8), np.float32), k=2)
  assert top.indices.shape == (4, 2) and np.all(np.asarray(top.indices) == -1)


@pytest.mark.parametrize("t", [9, 3000])  # the direct and the chunked top-k
def test_exact_ties_go_to_the_lower_target_index(t):
  e = 6
  y = np.zeros((t, e), np.float32)
  y[:, 1] = 1.0
  tied = [t - 1, 5, 2, 7] if t == 9 else [2900, 5, 1300, 129, 128, 2]
  y[tied, 0] = 3.0  # the same direction as the query, at different scales
  y[tied, 1] = 0.0
  x = np.zeros((2, e), np.float32)
  x[:, 0] = [1.0, 0.5]
  top = ops.cosine_topk(x, y, k=len(tied) + 1, block=1)
  np.testing.assert_array_equal(top.indices[:, :-1], np.broadcast_to(sorted(tied), (2, len(tied))))
  np.testing.assert_array_equal(top.values[:, :-1], 1.0)
  assert np.all(np.asarray(top.indices)[:, -1] == 0)  # then the first of the cos-0 rest
  # Identical targets have identical radii, so their CSLS ties as well.
  csls = ops.csls_topk(x, y, k=3, knn=2)
  np.testing.assert_array_equal(csls.indices, np.broadcast_to(sorted(tied)[:3], (2, 3)))
  # A tie between a chunk with a higher maximum (2901 next to 2900) and a lower chunk (700, alone).
  second = [2901, 700] if t == 3000 else [6, 3]
  y[second, :2] = [3.0, 4.0]
  top = ops.cosine_topk(x, y, k=len(tied) + 2)
  assert list(top.indices[0, -2:]) == sorted(second)


def test_zero_vectors_stay_zero():
  x, y = _data(6, (3, 8), (5, 8))
  x[1] = 0.0
  y[2] = 0.0
  cos = ref_cosine(x, y)
  assert cos[1].max() == 0 and np.all(cos[:, 2] == 0)
  top = ops.cosine_topk(x, y, k=5)
  assert np.all(np.isfinite(np.asarray(top.values)))
  np.testing.assert_array_equal(top.indices[1], [0, 1, 2, 3, 4])  # all tied at 0
  assert_topk(top, cos, 5)
  assert_topk(ops.csls_topk(x, y, k=5, knn=2), ref_csls(x, y, 2), 5, atol=4 * ATOL)


@pytest.mark.fast(lambda p: p["dtype"] != jnp.float32)  # float32 inputs: every other test.
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_low_precision_inputs(dtype):
  x, y = _data(7, (10, 16), (300, 16))
  x, y = jnp.asarray(x, dtype), jnp.asarray(y, dtype)
  # The reference sees the same rounded inputs; the kernel computes in float32.
  x64, y64 = np.asarray(x.astype(jnp.float32)), np.asarray(y.astype(jnp.float32))
  assert_topk(ops.cosine_topk(x, y, k=3), ref_cosine(x64, y64), 3)
  assert_topk(ops.csls_topk(x, y, k=2, knn=4), ref_csls(x64, y64, 4), 2, atol=4 * ATOL)


def test_approx_top_k_switch_on_this_backend():
  x, y = _data(8, (12, 16), (800, 16))
  # On CPU approx_max_k is exact; on TPU its recall is `recall_target`.
  top = ops.cosine_topk(x, y, k=4, approx=True, recall_target=0.99)
  np.testing.assert_allclose(top.values, ref_topk(ref_cosine(x, y), 4)[0], atol=ATOL)
  top = ops.csls_topk(x, y, k=2, approx=True)
  np.testing.assert_allclose(top.values, ref_topk(ref_csls(x, y, 10), 2)[0], atol=4 * ATOL)


def test_csls_matrix_matches_brute_force():
  x, y = _data(9, (7, 12), (11, 12))
  np.testing.assert_allclose(ops.csls_matrix(x, y, knn=3), ref_csls(x, y, 3), atol=4 * ATOL)
  sv, tv = np.array([1, 1, 0, 1, 1, 0, 1], bool), np.array([0, 1, 1, 1, 0, 1, 1, 1, 1, 1, 0], bool)
  got = np.asarray(ops.csls_matrix(x, y, knn=20, source_mask=sv, target_mask=tv))
  ref = ref_csls(x, y, 20, sv, tv)
  pair = sv[:, None] & tv[None, :]
  assert np.all(np.isneginf(got[~pair]))
  np.testing.assert_allclose(got[pair], ref[pair], atol=4 * ATOL)
  # The dense matrix and the blockwise top-k agree.
  top = ops.csls_topk(x, y, k=3, knn=20, source_mask=sv, target_mask=tv, block=2)
  assert_topk(top, np.where(pair, got.astype(np.float64), -np.inf), 3, tv, sv)


def test_jit_and_vmap():
  xs, ys = _data(10, (3, 5, 8), (3, 300, 8))
  batched = jax.jit(jax.vmap(lambda x, y: ops.csls_topk(x, y, k=2, knn=3, block=2)))(xs, ys)
  per_item = jax.jit(jax.vmap(lambda x, y: ops.cosine_topk(x, y, k=2, block=2)))(xs, ys)
  for b in range(3):
    assert_topk(ops.TopK(batched.values[b], batched.indices[b]), ref_csls(xs[b], ys[b], 3), 2, atol=4 * ATOL)
    assert_topk(ops.TopK(per_item.values[b], per_item.indices[b]), ref_cosine(xs[b], ys[b]), 2)
  masks = np.random.default_rng(0).random((3, 300)) < 0.5
  radius = jax.vmap(lambda x, y, m: ops.neighbourhood_radius(x, y, knn=4, target_mask=m))(xs, ys, masks)
  for b in range(3):
    np.testing.assert_allclose(radius[b], ref_radius(ref_cosine(xs[b], ys[b]), 4, masks[b]), atol=ATOL)


def test_nearest_neighbours_is_the_top_1_cosine_candidate():
  (table,) = _data(11, (61, 24))
  table[40] = table[3]  # a duplicate candidate: the first in `candidates` order wins
  queries = np.array([0, 5, 3, 60, 17], np.int32)
  candidates = np.array([3, 40, 8, 9, 22, 33, 50, 3], np.int32)[::-1].copy()
  got = ops.nearest_neighbours(jnp.asarray(table), jnp.asarray(queries), jnp.asarray(candidates), block=2)
  cos = ref_cosine(table[queries], table[candidates])
  np.testing.assert_array_equal(got, candidates[np.argmax(cos, axis=1)])
  assert got.dtype == jnp.int32 and got[2] == 3


def test_bad_arguments_raise_user_errors():
  x, y = _data(12, (4, 8), (5, 8))
  with pytest.raises(UserError, match="k must be"):
    ops.cosine_topk(x, y, k=0)
  with pytest.raises(UserError, match="knn must be"):
    ops.csls_topk(x, y, knn=0)
  with pytest.raises(UserError, match="mask must have shape"):
    ops.cosine_topk(x, y, k=1, target_mask=np.ones(4, bool))
  with pytest.raises(UserError, match=r"\[rows, embed\]"):
    ops.csls_matrix(x[0], y)
