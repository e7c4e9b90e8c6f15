"""AlignmentSolver: links by method against NumPy ports of SimAlign and the released aligner."""

import jax
import numpy as np
import pytest

from flax_xalign.errors import UserError
from flax_xalign.ops import AlignmentSolver, argmax_intersection, itermax, sinkhorn
from flax_xalign.ops import align_solver

SIZE = 20  # problems of 1..20 tokens per side, padded to SIZE x SIZE


def _onehot_rows(index, width):
  return np.eye(width, dtype=bool)[index]


def simalign_iter_max(sim, alpha=0.9, max_count=2):
  """SimAlign's `iter_max` on one unpadded [m, n] problem, from its documented steps.

  Forward argmax per row, backward argmax per column, intersection; no extra
  round when min(m, n) <= 2. Each extra round: mask_x = 1 on rows without a
  link (mask_y on columns), weight = clip(alpha mask_x + alpha mask_y, 0, 1),
  cells whose row and column are both aligned excluded (mask_zeros), new
  links = mutual argmax of sim * weight (argmax over the full row/column)
  restricted by mask_zeros; stop when nothing is added or no row or no
  column is left unaligned. Arithmetic stays in the input's float32.
  """
  m, n = sim.shape
  alpha = sim.dtype.type(alpha)
  inter = _onehot_rows(sim.argmax(axis=1), n) & _onehot_rows(sim.argmax(axis=0), m).T
  if min(m, n) <= 2:
    return inter
  for _ in range(max_count - 1):
    mask_x = np.broadcast_to(~inter.any(axis=1)[:, None], (m, n)).astype(sim.dtype)
    mask_y = np.broadcast_to(~inter.any(axis=0)[None, :], (m, n)).astype(sim.dtype)
    if mask_x.sum() < 1 or mask_y.sum() < 1:
      break
    weight = np.clip(alpha * mask_x + alpha * mask_y, 0, 1)
    mask_zeros = (1 - (1 - mask_x) * (1 - mask_y)) > 0
    weighted = sim * weight
    new = (_onehot_rows(weighted.argmax(axis=1), n) & _onehot_rows(weighted.argmax(axis=0), m).T
           & mask_zeros)
    if not np.any(new & ~inter):
      break
    inter = inter | new
  return inter


def _released_aligner(sim, iters=2):
  """xlmalign-ot-aligner.py in float64: pi = S; (xi = pi / colsum; pi = xi / rowsum) x iters;
  forward links = row argmax of pi, backward = column argmax of xi, intersected. (The aligner's
  `S[S <= 0] = 1e-6` fills a copy, so it never clamps: callers pass positive S.)"""
  pi = np.asarray(sim, np.float64)
  for _ in range(iters):
    xi = pi / pi.sum(axis=0, keepdims=True)
    pi = xi / xi.sum(axis=1, keepdims=True)
  m, n = pi.shape
  links = _onehot_rows(pi.argmax(axis=1), n) & _onehot_rows(xi.argmax(axis=0), m).T
  return links, (pi, 1), (xi, 0)


def _paper_pi_xi(sim, iters=2):
  """Eq. 6 in float64 with the pi_xi reading: forward links from the iterate right after the
  last u step (rows sum to 1), backward links from A* (columns sum to 1)."""
  k = np.asarray(sim, np.float64)
  v = np.ones(k.shape[1])
  for _ in range(iters):
    v_prev = v
    u = 1.0 / (k @ v)
    v = 1.0 / (k.T @ u)
  rows, plan = u[:, None] * k * v_prev[None, :], u[:, None] * k * v[None, :]
  m, n = k.shape
  links = _onehot_rows(rows.argmax(axis=1), n) & _onehot_rows(plan.argmax(axis=0), m).T
  return links, (rows, 1), (plan, 0)


def _clear_margin(*matrices_and_axes, rel=1e-5):
  """No near-tie (relative gap < rel) between the top two of any argmaxed row/column."""
  for matrix, axis in matrices_and_axes:
    if matrix.shape[axis] < 2:
      continue
    top = -np.sort(-matrix, axis=axis).take([0, 1], axis=axis)
    best, second = top.take(0, axis=axis), top.take(1, axis=axis)
    if np.any(best - second < rel * np.abs(best)):
      return False
  return True


def _random_problems(rng, count, *, positive=False, dim=16):
  """Similarities of `count` pairs of synthetic token vectors with random sizes in 1..SIZE.

  Returns (cosines [count, SIZE, SIZE] float32, dot products, mask, sizes). With `positive`
  the vectors share a common component, so dot products are positive (as hidden states'
  mostly are).
  """
  sizes = rng.integers(1, SIZE + 1, size=(count, 2))
  sizes[:6] = [(1, 1), (1, 5), (2, 7), (3, 3), (SIZE, 2), (SIZE, SIZE)]
  cosines = np.zeros((count, SIZE, SIZE), np.float32)
  dots = np.zeros((count, SIZE, SIZE), np.float32)
  mask = np.zeros((count, SIZE, SIZE), bool)
  for k, (n, m) in enumerate(sizes):
    meaning = rng.normal(size=(max(n, m), dim))
    a = meaning[rng.permutation(max(n, m))[:n]] + rng.normal(size=(n, dim))
    b = meaning[rng.permutation(max(n, m))[:m]] + rng.normal(size=(m, dim))
    if positive:
      common = 4.0 * rng.normal(size=dim)
      a, b = a + common, b + common
    dots[k, :n, :m] = a @ b.T
    a /= np.linalg.norm(a, axis=1, keepdims=True)
    b /= np.linalg.norm(b, axis=1, keepdims=True)
    cosines[k, :n, :m] = a @ b.T
    mask[k, :n, :m] = True
  return cosines, dots, mask, sizes


def _links(solver, similarity, mask, method):
  fn = jax.jit(lambda s, m: solver.links(s, m, method))
  return np.asarray(fn(similarity, mask))


def test_paper_default_does_not_saturate_on_a_many_to_one_pair():
  # Raw dot products (|S| ~ 100). Source row 2 is the best row of target
  # columns 3, 4 and 5, and its own best column is 5 (the true link).
  rng = np.random.default_rng(0)
  sim = 3 * rng.normal(size=(6, 8)) + 40
  for i, j in [(0, 0), (1, 1), (3, 6), (4, 7), (5, 2)]:
    sim[i, j] += 60
  sim[2, 3] += 70
  sim[2, 4] += 75
  sim[2, 5] += 85
  sim = sim.astype(np.float32)
  mask = np.ones_like(sim, bool)
  expected = {(0, 0), (1, 1), (2, 5), (3, 6), (4, 7), (5, 2)}
  as_set = lambda links: set(map(tuple, np.argwhere(np.asarray(links)).tolist()))

  # The old default: unscaled exp(S / 1) saturates; every column's mass sits
  # on its best row, row 2 holds three bit-identical entries and the index
  # tie-break links the leftmost column.
  old = jax.jit(lambda s, m: sinkhorn(s, m, kernel="entropic", relative_mu=False).plan)(sim, mask)
  row = np.asarray(old)[2]
  assert row[3] == row[4] == row[5] == 1 / 8
  assert as_set(jax.jit(argmax_intersection)(old, mask)) == expected - {(2, 5)} | {(2, 3)}

  # The paper's kernel (Eq. 1 + 5 + 6): row 2's plan entries keep their order
  # (independently: float64 NumPy of Eq. 6), and the default links are right.
  plan, _ = _paper_pi_xi(sim)[2]
  assert plan[:, 5].argmax() == 2 and plan[2].argmax() == 5
  assert as_set(_links(AlignmentSolver(), sim, mask, "sinkhorn")) == expected
  assert as_set(jax.jit(argmax_intersection)(sim, mask)) == expected
  # So do the relatively scaled entropic kernel, and the saturated one once
  # ties are broken by the similarity instead of the index.
  for solver in (AlignmentSolver(sinkhorn_kernel="entropic"),
                 AlignmentSolver(sinkhorn_kernel="entropic", relative_mu=False)):
    assert as_set(_links(solver, sim, mask, "sinkhorn")) == expected
  # Self-labelling (Itermax on the plan) gets the same link.
  labels, _ = jax.jit(AlignmentSolver().self_labels)(sim, mask)
  assert (2, 5) in as_set(labels) and (2, 3) not in as_set(labels)
  old_labels = jax.jit(itermax)(old, mask)
  assert (2, 3) in as_set(old_labels) and (2, 5) not in as_set(old_labels)


def test_itermax_links_equal_simalign_on_cosine_similarities():
  rng = np.random.default_rng(1)
  cosines, _, mask, sizes = _random_problems(rng, 240)
  solver = AlignmentSolver(similarity="cosine")
  got = _links(solver, cosines, mask, "itermax")
  old = np.asarray(jax.jit(solver.itermax)(cosines, mask))  # raw cosines, shifted by the minimum
  assert not np.any(got[~mask])
  old_differs = 0
  for k, (n, m) in enumerate(sizes):
    shifted = (cosines[k, :n, :m] + np.float32(1)) / np.float32(2)
    expected = simalign_iter_max(shifted)
    np.testing.assert_array_equal(got[k, :n, :m], expected, err_msg=f"problem {k}: {n}x{m}")
    old_differs += not np.array_equal(old[k, :n, :m], expected)
  # Feeding raw (min-shifted) cosines is not SimAlign: the multiplicative
  # reweighting sees a different offset and round 2 picks other links.
  assert old_differs > 0
  print(f"old itermax path differs from SimAlign on {old_differs} of {len(sizes)} problems")


def test_itermax_on_dot_products_shifts_each_problem_by_its_minimum():
  rng = np.random.default_rng(2)
  _, dots, mask, sizes = _random_problems(rng, 60)
  got = _links(AlignmentSolver(), dots, mask, "itermax")
  for k, (n, m) in enumerate(sizes):
    sim = dots[k, :n, :m]
    np.testing.assert_array_equal(got[k, :n, :m], simalign_iter_max(sim - sim.min()))


@pytest.mark.parametrize("order,reference", [("columns_first", _released_aligner),
                                             ("rows_first", _paper_pi_xi)])
def test_pi_xi_extraction_matches_float64_references(order, reference):
  rng = np.random.default_rng(3)
  _, dots, mask, sizes = _random_problems(rng, 200, positive=True)
  assert np.all(dots[mask] > 0)  # the released aligner never clamps
  solver = AlignmentSolver(sinkhorn_order=order, sinkhorn_extraction="pi_xi")
  got = _links(solver, dots, mask, "sinkhorn")
  compared = 0
  # A side of one token makes the other side's iterate constant: an exact tie
  # that the reference gives to the first index and we to the similarity.
  candidates = [k for k, (n, m) in enumerate(sizes) if min(n, m) > 1]
  for k in candidates:
    n, m = sizes[k]
    expected, rows, cols = reference(dots[k, :n, :m])
    if not _clear_margin(rows, cols):  # float32 vs float64 may break a near tie differently
      continue
    compared += 1
    np.testing.assert_array_equal(got[k, :n, :m], expected, err_msg=f"problem {k}: {n}x{m}")
  assert compared >= len(candidates) - 3 and len(candidates) > 170
  # The switch matters, mostly where the clamp is active (dot products with
  # negative entries): there the two readings differ in about a quarter of
  # the problems, on these all-positive ones rarely.
  _, dots, mask, _ = _random_problems(rng, 100)
  plan_links = _links(AlignmentSolver(sinkhorn_order=order), dots, mask, "sinkhorn")
  assert np.any(plan_links != _links(solver, dots, mask, "sinkhorn"))


def test_links_methods_and_mask():
  rng = np.random.default_rng(4)
  _, dots, mask, sizes = _random_problems(rng, 40)
  solver = AlignmentSolver()
  argmax = _links(solver, dots, mask, "argmax")
  sinkhorn_links = _links(solver, dots, mask, "sinkhorn")
  for k, (n, m) in enumerate(sizes):
    sim = dots[k, :n, :m]
    expected = _onehot_rows(sim.argmax(axis=1), m) & _onehot_rows(sim.argmax(axis=0), n).T
    np.testing.assert_array_equal(argmax[k, :n, :m], expected)
  for links in (argmax, sinkhorn_links):
    assert not np.any(links[~mask])
  with pytest.raises(UserError, match="method"):
    solver.links(dots, mask, "mwmf")


def test_self_labels_on_packed_pairs_equal_each_pair_alone():
  rng = np.random.default_rng(5)
  _, dots, _, _ = _random_problems(rng, 6)
  # Pairs (5 x 4) and (3 x 6) packed on the block diagonal of one 10 x 12 row.
  row_seg = np.array([1] * 5 + [2] * 3 + [0] * 2)
  col_seg = np.array([1] * 4 + [2] * 6 + [0] * 2)
  sim = np.zeros((10, 12), np.float32)
  sim[:5, :4], sim[5:8, 4:10] = dots[5, :5, :4], dots[5, 5:8, 4:10]  # a 20 x 20 problem
  mask = (row_seg[:, None] == col_seg[None, :]) & (row_seg[:, None] > 0)
  for solver in (AlignmentSolver(), AlignmentSolver(sinkhorn_kernel="entropic", similarity="cosine")):
    fn = jax.jit(lambda s, m, r, c, solver=solver: solver.self_labels(s, m, row_segments=r, col_segments=c))
    links, result = fn(sim, mask, row_seg, col_seg)
    links = np.asarray(links)
    assert not np.any(links[~mask])
    for rows, cols in [(slice(0, 5), slice(0, 4)), (slice(5, 8), slice(4, 10))]:
      # Jitted: one compile per block shape instead of one per primitive and shape (eager).
      alone, alone_plan = jax.jit(solver.self_labels)(sim[rows, cols], np.ones_like(sim[rows, cols], bool))
      np.testing.assert_array_equal(links[rows, cols], alone)
      np.testing.assert_allclose(np.asarray(result.plan)[rows, cols], alone_plan.plan, rtol=1e-5)


@pytest.mark.parametrize("field,value", [
    ("similarity", "l2"), ("sinkhorn_kernel", "exp"), ("sinkhorn_order", "diagonal"),
    ("sinkhorn_extraction", "xi"), ("mu", 0.0), ("clamp_epsilon", -1.0), ("relative_mu", "yes"),
    ("sinkhorn_iters", 0), ("itermax_rounds", 1.5), ("itermax_alpha", 1.5), ("softmax_threshold", 0.0),
    ("softmax_threshold", 1.0)])
def test_bad_settings_raise_one_user_error_naming_the_field(field, value):
  with pytest.raises(UserError, match=field):
    AlignmentSolver(**{field: value})


def test_defaults_are_the_papers():
  solver = AlignmentSolver()
  assert (solver.similarity, solver.sinkhorn_kernel, solver.sinkhorn_order, solver.mu, solver.sinkhorn_iters,
          solver.sinkhorn_extraction, solver.itermax_alpha, solver.itermax_rounds) == (
              "dot", "clamped", "rows_first", 1.0, 2, "plan", 0.9, 2)


def test_sinkhorn_itermax_equals_simalign_itermax_on_the_float64_plan():
  # The paper's §3.1 (Table 2's "Optimal Transport (Section 3.1)"): Eq. 6's plan in
  # float64, then SimAlign's iter_max on it, both written independently above.
  rng = np.random.default_rng(6)
  _, dots, mask, sizes = _random_problems(rng, 200, positive=True)
  solver = AlignmentSolver()
  got = _links(solver, dots, mask, "sinkhorn_itermax")
  plan_links = _links(solver, dots, mask, "sinkhorn")
  assert not np.any(got[~mask])
  # A side of one token gives a constant plan row/column: an exact tie the reference
  # gives to the first index and we to the similarity.
  candidates = [k for k, (n, m) in enumerate(sizes) if min(n, m) > 1]
  compared = adds = 0
  for k in candidates:
    n, m = sizes[k]
    _, _, (plan, _) = _paper_pi_xi(dots[k, :n, :m])
    # Itermax's second round compares plan entries against 0.9 x plan entries too.
    if not _clear_margin((plan, 0), (plan, 1), (np.concatenate([plan, 0.9 * plan], 1), 1),
                         (np.concatenate([plan, 0.9 * plan], 0), 0)):
      continue
    compared += 1
    expected = simalign_iter_max(plan)
    np.testing.assert_array_equal(got[k, :n, :m], expected, err_msg=f"problem {k}: {n}x{m}")
    # Its first round is the "sinkhorn" method's mutual argmax; later rounds only add links.
    assert np.all(got[k, :n, :m] >= plan_links[k, :n, :m])
    adds += got[k, :n, :m].sum() > plan_links[k, :n, :m].sum()
  assert compared >= 0.8 * len(candidates) and len(candidates) > 170
  assert adds > 10  # Itermax matters: "sinkhorn" alone is not the §3.1 procedure.
  # And it is exactly what DWA self-labels with.
  labels, _ = jax.jit(solver.self_labels)(dots, mask)
  np.testing.assert_array_equal(got, np.asarray(labels))


def awesome_align_softmax_links(sim, threshold=1e-3):
  """awesome-align's extraction on one unpadded [n, m] problem, from its description (Dou & Neubig 2021, §2.2):
  softmax over each row and over each column of the similarity, a link where both exceed the threshold
  (float64 here; awesome-align computes in float32 torch)."""
  sim = np.asarray(sim, np.float64)
  rows = np.exp(sim - sim.max(axis=1, keepdims=True))
  rows /= rows.sum(axis=1, keepdims=True)
  cols = np.exp(sim - sim.max(axis=0, keepdims=True))
  cols /= cols.sum(axis=0, keepdims=True)
  return (rows > threshold) & (cols > threshold)


@pytest.mark.parametrize("threshold", [1e-3, 0.1])
def test_softmax_links_equal_awesome_aligns_extraction(threshold):
  rng = np.random.default_rng(7)
  _, dots, mask, sizes = _random_problems(rng, 200)
  got = _links(AlignmentSolver(softmax_threshold=threshold), dots, mask, "softmax")
  assert not np.any(got[~mask])
  near = 0
  for k, (n, m) in enumerate(sizes):
    expected = awesome_align_softmax_links(dots[k, :n, :m], threshold)
    differ = got[k, :n, :m] != expected
    if differ.any():  # Only where a float32 softmax sits within rounding of the threshold.
      sim = np.asarray(dots[k, :n, :m], np.float64)
      rows = np.exp(sim - sim.max(1, keepdims=True))
      rows /= rows.sum(1, keepdims=True)
      cols = np.exp(sim - sim.max(0, keepdims=True))
      cols /= cols.sum(0, keepdims=True)
      closest = np.minimum(np.abs(rows - threshold), np.abs(cols - threshold))[differ]
      assert np.all(closest < 1e-6 * max(threshold, 1e-3) * 10), (k, n, m, closest)
      near += int(differ.sum())
  assert near <= 2
  # A one-by-one problem links; a larger threshold links less.
  assert got[[k for k, (n, m) in enumerate(sizes) if (n, m) == (1, 1)][0], 0, 0]


def test_softmax_links_of_packed_pairs_equal_each_pair_alone():
  rng = np.random.default_rng(8)
  a, b = rng.normal(size=(3, 8)) * 3, rng.normal(size=(4, 8)) * 3
  c, d = rng.normal(size=(2, 8)) * 3, rng.normal(size=(5, 8)) * 3
  solver = AlignmentSolver()
  packed = np.zeros((5, 9), np.float32)
  packed[:3, :4], packed[3:, 4:] = a @ b.T, c @ d.T
  packed[:3, 4:], packed[3:, :4] = 50.0, 50.0  # Across problems: large, and masked out.
  mask = np.zeros((5, 9), bool)
  mask[:3, :4] = mask[3:, 4:] = True
  got = _links(solver, packed[None], mask[None], "softmax")[0]
  np.testing.assert_array_equal(got[:3, :4], awesome_align_softmax_links(a @ b.T))
  np.testing.assert_array_equal(got[3:, 4:], awesome_align_softmax_links(c @ d.T))
  assert not got[:3, 4:].any() and not got[3:, :4].any()


def brute_force_max_weight_matching(sim):
  """Every matching of min(n, m) links of one small [n, m] problem, the heaviest (float64)."""
  import itertools

  n, m = sim.shape
  best, best_links = -np.inf, None
  if n <= m:
    candidates = ([(i, j) for i, j in enumerate(cols)] for cols in itertools.permutations(range(m), n))
  else:
    candidates = ([(i, j) for j, i in enumerate(rows)] for rows in itertools.permutations(range(n), m))
  for links in candidates:
    weight = sum(float(sim[i, j]) for i, j in links)
    if weight > best:
      best, best_links = weight, links
  out = np.zeros((n, m), bool)
  for i, j in best_links:
    out[i, j] = True
  return out


def test_match_links_are_the_heaviest_matching_of_min_n_m_links():
  rng = np.random.default_rng(9)
  for k in range(60):
    n, m = (1, 1) if k == 0 else (1, 6) if k == 1 else (6, 2) if k == 2 else tuple(rng.integers(1, 7, size=2))
    cosines = np.tanh(rng.normal(size=(n, m))).astype(np.float32)
    expected = brute_force_max_weight_matching(cosines.astype(np.float64))
    got = align_solver.match_links(cosines)
    np.testing.assert_array_equal(got, expected, err_msg=f"problem {k}: {n}x{m}")
    assert got.sum() == min(n, m)
    # SimAlign feeds (cos + 1) / 2: the same matching.
    np.testing.assert_array_equal(align_solver.match_links((cosines + 1) / 2), expected)
  dots = np.ones((1, 3, 3), np.float32)
  with pytest.raises(ValueError, match="host"):
    AlignmentSolver().links(dots, np.ones_like(dots, bool), "match")
