"""Itermax and argmax intersection against a plain NumPy reading of SimAlign."""

import jax
import numpy as np
import pytest

from flax_xalign.ops import argmax_intersection, itermax

align = jax.jit(itermax, static_argnames=("alpha", "max_count"))
intersect = jax.jit(argmax_intersection)
PAD = 7  # problems of up to 7 x 7, padded to 7 x 9
COLS = 9


def _mutual(x):
  n, m = x.shape
  row_best = np.zeros((n, m), bool)
  row_best[np.arange(n), x.argmax(axis=1)] = True
  col_best = np.zeros((n, m), bool)
  col_best[x.argmax(axis=0), np.arange(m)] = True
  return row_best & col_best


def _reference_itermax(sim, alpha=0.9, max_count=2):
  """SimAlign's itermax on one unpadded problem, as a plain loop."""
  links = _mutual(sim)
  if min(sim.shape) <= 2:
    return links
  for _ in range(max_count - 1):
    row_free = ~links.any(axis=1)
    col_free = ~links.any(axis=0)
    if not row_free.any() or not col_free.any():
      break
    weight = np.clip(alpha * row_free[:, None] + alpha * col_free[None, :], 0.0, 1.0)
    new = _mutual(sim * weight) & (row_free[:, None] | col_free[None, :])
    if not new.any():
      break
    links = links | new
  return links


def _random_padded(rng, count, low=0.0):
  """`count` problems with random sizes in [1, 7], padded to PAD x COLS."""
  sizes = rng.integers(1, PAD + 1, size=(count, 2))
  scores = rng.uniform(low, 1.0, size=(count, PAD, COLS)).astype(np.float32)
  masks = np.zeros_like(scores, bool)
  for k, (n, m) in enumerate(sizes):
    masks[k, :n, :m] = True
  return scores, masks, sizes


@pytest.mark.fast(lambda p: p["max_count"] <= 2)  # No extra round, and the default one extra round.
@pytest.mark.parametrize("max_count", [1, 2, 3, 4])
def test_matches_reference_on_random_ragged_problems(max_count):
  rng = np.random.default_rng(max_count)
  scores, masks, sizes = _random_padded(rng, 300)
  got = np.asarray(align(scores, masks, max_count=max_count))
  assert not np.any(got[~masks])
  for k, (n, m) in enumerate(sizes):
    expected = _reference_itermax(scores[k, :n, :m], max_count=max_count)
    np.testing.assert_array_equal(got[k, :n, :m], expected, err_msg=f"{k}: {n}x{m}")
  # Sides of 1, 2 and 3 tokens all occur, and the extra rounds do add links.
  assert {1, 2, 3} <= set(sizes.min(axis=1).tolist())
  if max_count > 1:
    assert got.sum() > np.asarray(intersect(scores, masks)).sum()


def test_other_alpha_matches_reference():
  rng = np.random.default_rng(10)
  scores, masks, sizes = _random_padded(rng, 100)
  got = np.asarray(align(scores, masks, alpha=0.6, max_count=3))
  for k, (n, m) in enumerate(sizes):
    expected = _reference_itermax(scores[k, :n, :m], alpha=0.6, max_count=3)
    np.testing.assert_array_equal(got[k, :n, :m], expected)


def test_negative_scores_are_shifted_by_the_problem_minimum():
  rng = np.random.default_rng(11)
  scores, masks, sizes = _random_padded(rng, 200, low=-1.0)
  scores[:, PAD - 1] = -50.0  # padding values must not enter the minimum
  got = np.asarray(align(scores, masks, max_count=2))
  first = np.asarray(intersect(scores, masks))
  for k, (n, m) in enumerate(sizes):
    sim = scores[k, :n, :m]
    np.testing.assert_array_equal(got[k, :n, :m], _reference_itermax(sim - sim.min()))
    np.testing.assert_array_equal(first[k, :n, :m], _mutual(sim))
  # Nonnegative problems are not shifted: shifting them would change results.
  positive = np.abs(scores)
  got = np.asarray(align(positive, masks, max_count=2))
  for k, (n, m) in enumerate(sizes):
    np.testing.assert_array_equal(got[k, :n, :m], _reference_itermax(positive[k, :n, :m]))


def test_no_unaligned_row_left_adds_nothing():
  # Round 1 aligns every row; (0, 3) would be the mutual argmax of the
  # reweighted matrix, but SimAlign stops when no row is left unaligned.
  scores = np.array([[0.90, 0.10, 0.10, 0.80, 0.10],
                     [0.10, 0.90, 0.10, 0.10, 0.10],
                     [0.10, 0.10, 0.90, 0.10, 0.20]], np.float32)
  mask = np.ones_like(scores, bool)
  got = np.asarray(align(scores, mask, max_count=2))
  np.testing.assert_array_equal(got, np.eye(3, 5, dtype=bool))
  np.testing.assert_array_equal(got, _reference_itermax(scores))


def _packed(rng, count):
  """Block-diagonal packs of 1-4 random problems in a 12 x 14 matrix."""
  rows, cols = 12, 14
  scores = rng.uniform(size=(count, rows, cols)).astype(np.float32)
  row_seg = np.zeros((count, rows), np.int32)
  col_seg = np.zeros((count, cols), np.int32)
  blocks = []
  for k in range(count):
    r = c = 0
    pack = []
    for seg in range(1, rng.integers(1, 5) + 1):
      n, m = rng.integers(1, 5, size=2)
      if r + n > rows or c + m > cols:
        break
      row_seg[k, r:r + n], col_seg[k, c:c + m] = seg, seg
      pack.append((slice(r, r + n), slice(c, c + m)))
      r, c = r + n, c + m
    blocks.append(pack)
  masks = (row_seg[:, :, None] == col_seg[:, None, :]) & (row_seg[:, :, None] > 0)
  return scores, masks, row_seg, col_seg, blocks


@pytest.mark.fast("2")
@pytest.mark.parametrize("max_count", [2, 3])
def test_block_diagonal_packing_equals_per_block_itermax(max_count):
  rng = np.random.default_rng(20 + max_count)
  scores, masks, row_seg, col_seg, blocks = _packed(rng, 150)
  got = np.asarray(align(scores, masks, max_count=max_count,
                         row_segments=row_seg, col_segments=col_seg))
  assert not np.any(got[~masks])
  for k, pack in enumerate(blocks):
    for rows, cols in pack:
      expected = _reference_itermax(scores[k, rows, cols], max_count=max_count)
      np.testing.assert_array_equal(got[k, rows, cols], expected)
  # Without segments the packed matrix is one problem: results differ.
  unsegmented = np.asarray(align(scores, masks, max_count=max_count))
  assert np.any(unsegmented != got)


def test_leading_batch_dims_and_vmap():
  rng = np.random.default_rng(30)
  scores, masks, _ = _random_padded(rng, 6)
  scores, masks = scores.reshape(2, 3, PAD, COLS), masks.reshape(2, 3, PAD, COLS)
  batched = np.asarray(align(scores, masks))
  vmapped = jax.jit(jax.vmap(jax.vmap(itermax)))(scores, masks)
  for i in range(2):
    for j in range(3):
      np.testing.assert_array_equal(batched[i, j], align(scores[i, j], masks[i, j]))
  np.testing.assert_array_equal(vmapped, batched)


def test_argmax_intersection_basic_cases():
  scores = np.array([[0.1, 0.9, 0.0],
                     [0.8, 0.7, 0.0],
                     [0.2, 0.6, 5.0]], np.float32)
  mask = np.ones((3, 3), bool)
  np.testing.assert_array_equal(
      intersect(scores, mask), [[0, 1, 0], [1, 0, 0], [0, 0, 1]])
  mask[:, 2] = False  # the 5.0 is padding now; row 2 prefers column 1 but loses it
  np.testing.assert_array_equal(
      intersect(scores, mask), [[0, 1, 0], [1, 0, 0], [0, 0, 0]])
  assert not np.any(intersect(scores, np.zeros((3, 3), bool)))
  one = np.asarray(intersect(np.array([[0.3, 0.5]], np.float32), np.ones((1, 2), bool)))
  np.testing.assert_array_equal(one, [[0, 1]])


def test_only_one_segment_argument_raises():
  with pytest.raises(ValueError, match="segments"):
    itermax(np.zeros((2, 2)), np.ones((2, 2), bool), row_segments=np.zeros(2, np.int32))


def test_exact_ties_go_to_the_tie_break_then_to_the_first_index():
  # Row 0 ties across columns 0-2 (a saturated plan); the second key prefers column 2.
  scores = np.array([[0.5, 0.5, 0.5, 0.1],
                     [0.1, 0.1, 0.1, 0.6],
                     [0.2, 0.3, 0.1, 0.1]], np.float32)
  second = np.array([[1.0, 2.0, 3.0, 0.0],
                     [0.0, 0.0, 0.0, 0.0],
                     [0.0, 0.0, 0.0, 0.0]], np.float32)
  mask = np.ones_like(scores, bool)
  by_index = np.asarray(intersect(scores, mask))
  assert by_index[0, 0] and not by_index[0, 2]
  broken = np.asarray(argmax_intersection(scores, mask, tie_break=second))
  np.testing.assert_array_equal(broken, [[0, 0, 1, 0], [0, 0, 0, 1], [0, 0, 0, 0]])
  # Tied on both keys: the first index, as numpy.
  np.testing.assert_array_equal(argmax_intersection(scores, mask, tie_break=np.zeros_like(scores)), by_index)
  # Round 2 (row 2, columns 0 and 1 free) weighs row 0 as [.45, .45, 0, 0]: a
  # tie that the second key gives to column 1, whose best row is row 0.
  np.testing.assert_array_equal(itermax(scores, mask, tie_break=second),
                                [[0, 1, 1, 0], [0, 0, 0, 1], [0, 0, 0, 0]])


def test_column_argmaxes_can_come_from_other_scores():
  rows = np.array([[0.9, 0.1], [0.8, 0.2]], np.float32)  # both rows prefer column 0
  cols = np.array([[0.1, 0.9], [0.7, 0.3]], np.float32)  # column 0 prefers row 1
  links = np.asarray(argmax_intersection(rows, np.ones((2, 2), bool), col_scores=cols))
  np.testing.assert_array_equal(links, [[0, 0], [1, 0]])
