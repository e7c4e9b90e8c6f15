"""Masked Sinkhorn: the paper's Eq. 6, the released loop, POT at convergence, edges."""

import functools
import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment

from flax_xalign.ops import sinkhorn as ops_sinkhorn
from flax_xalign.ops import uniform_marginals


def _import_pot():
  """POT with its numpy backend only.

  POT imports every array library it finds (TensorFlow, PyTorch) to register
  backends, ~10 s here; these tests only use numpy.
  """
  os.environ.setdefault("POT_BACKEND_DISABLE_TENSORFLOW", "1")
  os.environ.setdefault("POT_BACKEND_DISABLE_PYTORCH", "1")
  import ot  # pylint: disable=g-import-not-at-top
  return ot


ot = _import_pot()

_STATIC = ("mu", "num_iters", "kernel", "order", "relative_mu", "clamp_epsilon", "domain")
solve = jax.jit(ops_sinkhorn, static_argnames=_STATIC)
# Textbook entropic OT with an absolute temperature, comparable with POT's `reg`.
entropic = functools.partial(solve, kernel="entropic", relative_mu=False)
released = functools.partial(solve, kernel="clamped", order="columns_first")
marginals = jax.jit(uniform_marginals)
LOG_ZERO = -1e30
N, M = 5, 7


def _ragged_mask(rows, cols, n=N, m=M):
  mask = np.zeros((n, m), bool)
  mask[:rows, :cols] = True
  return mask


def _pot_plan(sim, mu, solver):
  """Converged POT plan with uniform marginals, in float64."""
  sim = np.asarray(sim, np.float64)
  a = np.full(sim.shape[0], 1.0 / sim.shape[0])
  b = np.full(sim.shape[1], 1.0 / sim.shape[1])
  return solver(a, b, -sim, mu, numItermax=20000, stopThr=1e-13)


def _numpy_entropic(sim, mu, iters, a=None, b=None):
  """Paper Eq. 6, float64 (uniform marginals by default): v = 1; u = a / Kv; v = b / K^T u."""
  k = np.exp(np.asarray(sim, np.float64) / mu)
  a = np.full(k.shape[0], 1.0 / k.shape[0]) if a is None else np.asarray(a, np.float64)
  b = np.full(k.shape[1], 1.0 / k.shape[1]) if b is None else np.asarray(b, np.float64)
  v = np.ones(k.shape[1])
  for _ in range(iters):
    u = a / (k @ v)
    v = b / (k.T @ u)
  return u[:, None] * k * v[None, :]


def _numpy_clamped(sim, iters, eps=1e-6):
  """The released XLM-Align loop: clamp, then columns-then-rows normalisation.

  Returns (pi, xi): the final row-normalised matrix and the column-normalised
  one before the last row normalisation.
  """
  pi = np.maximum(np.asarray(sim, np.float64), eps)
  for _ in range(iters):
    xi = pi / pi.sum(axis=0, keepdims=True)
    pi = xi / xi.sum(axis=1, keepdims=True)
  return pi, xi


def _numpy_paper(sim, iters, mu=1.0, eps=1e-6):
  """Paper Eq. 1, 5, 6 in float64: K = exp(log max(eps, S) / mu), v = 1, u = 1 / Kv, v = 1 / K^T u.

  Returns (A*, the iterate diag(u) K diag(v_prev) right after the last u step).
  """
  k = np.exp(np.log(np.maximum(np.asarray(sim, np.float64), eps)) / mu)
  v = np.ones(k.shape[1])
  for _ in range(iters):
    v_prev = v
    u = 1.0 / (k @ v)
    v = 1.0 / (k.T @ u)
  return u[:, None] * k * v[None, :], u[:, None] * k * v_prev[None, :]


@pytest.mark.fast("sinkhorn")
@pytest.mark.parametrize("solver", [ot.sinkhorn, ot.bregman.sinkhorn_log],
                         ids=["sinkhorn", "sinkhorn_log"])
def test_entropic_converges_to_pot_including_ragged_masks(solver):
  rng = np.random.default_rng(0)
  sims = rng.normal(size=(3, N, M)).astype(np.float32)
  shapes = [(N, M), (3, 6), (4, 2)]
  masks = np.stack([_ragged_mask(r, c) for r, c in shapes])
  result = entropic(sims, masks, mu=0.5, num_iters=500)
  plan = np.asarray(result.plan)
  for k, (rows, cols) in enumerate(shapes):
    expected = _pot_plan(sims[k, :rows, :cols], 0.5, solver)
    np.testing.assert_allclose(plan[k, :rows, :cols], expected, atol=2e-7, rtol=2e-5)
    assert np.all(plan[k][~masks[k]] == 0.0)
  np.testing.assert_allclose(np.exp(result.log_plan), plan, atol=1e-9, rtol=1e-5)


def test_given_marginals_converge_to_pot_and_unreachable_mass_is_dropped():
  rng = np.random.default_rng(9)
  sim = rng.normal(size=(N, M)).astype(np.float32)
  a, b = rng.uniform(0.5, 1.5, size=N), rng.uniform(0.5, 1.5, size=M)
  a, b = a / a.sum(), b / b.sum()
  plan = entropic(sim, np.ones((N, M), bool), mu=0.5, num_iters=500,
                  row_marginal=a, col_marginal=b).plan
  expected = ot.sinkhorn(a, b, -sim.astype(np.float64), 0.5, numItermax=20000, stopThr=1e-13)
  np.testing.assert_allclose(plan, expected, atol=2e-7, rtol=2e-5)
  # Row 0 has no mass and column 6 is valid only in row 0: both carry nothing,
  # masked entries stay exactly 0 and nothing is NaN.
  mask = _ragged_mask(N, 6)
  mask[0, 6] = True
  a_zero = np.where(np.arange(N) == 0, 0.0, 0.25).astype(np.float32)
  b_all = np.full(M, 1 / M, np.float32)
  result = entropic(sim, mask, mu=0.5, num_iters=3, row_marginal=a_zero, col_marginal=b_all)
  plan, log_plan = np.asarray(result.plan), np.asarray(result.log_plan)
  assert np.all(np.isfinite(plan)) and np.all(np.isfinite(log_plan))
  assert np.all(plan[~mask] == 0.0) and np.all(plan[0] == 0.0) and np.all(plan[:, 6] == 0.0)
  np.testing.assert_allclose(plan.sum(0)[:6], np.full(6, 1 / M), rtol=1e-5)


def test_two_entropic_iterations_follow_paper_eq6_and_pot_on_the_transpose():
  rng = np.random.default_rng(1)
  sim = rng.normal(size=(N, M)).astype(np.float32)
  mask = _ragged_mask(4, 6)
  plan = np.asarray(entropic(sim, mask, mu=0.3, num_iters=2).plan)
  expected = _numpy_entropic(sim[:4, :6], 0.3, 2)
  np.testing.assert_allclose(plan[:4, :6], expected, rtol=2e-5, atol=1e-8)
  # POT updates the column scaling first; on the transposed problem its first
  # step is our row step, so two of its iterations are exactly ours.
  with warnings.catch_warnings():  # "did not converge": two steps on purpose
    warnings.simplefilter("ignore", UserWarning)
    pot = ot.sinkhorn(np.full(6, 1 / 6), np.full(4, 1 / 4), -sim[:4, :6].T.astype(np.float64),
                      0.3, method="sinkhorn", numItermax=2, stopThr=0.0)
  np.testing.assert_allclose(plan[:4, :6], pot.T, rtol=2e-5, atol=1e-8)
  # The last step is a column step: columns carry b exactly.
  np.testing.assert_allclose(plan[:4, :6].sum(0), np.full(6, 1 / 6), rtol=1e-5)


def test_two_clamped_iterations_follow_the_released_code():
  rng = np.random.default_rng(2)
  sim = rng.normal(size=(N, M)).astype(np.float32)  # about half <= 0: clamped
  mask = _ragged_mask(4, 6)
  result = released(sim, mask, num_iters=2)
  pi, xi = _numpy_clamped(sim[:4, :6], 2)
  np.testing.assert_allclose(np.asarray(result.plan)[:4, :6], pi, rtol=2e-5, atol=1e-12)
  np.testing.assert_allclose(np.asarray(result.plan).sum(1), [1, 1, 1, 1, 0], rtol=1e-5)
  np.testing.assert_allclose(np.asarray(result.log_plan)[:4, :6], np.log(pi), rtol=2e-5)
  np.testing.assert_array_equal(result.row_plan, result.plan)
  np.testing.assert_allclose(np.asarray(result.col_plan)[:4, :6], xi, rtol=2e-5, atol=1e-12)
  assert np.all(np.asarray(result.col_plan)[~mask] == 0)


@pytest.mark.fast("log-1.0", "auto-0.5")  # Each domain and each mu once.
@pytest.mark.parametrize("mu", [1.0, 0.5])
@pytest.mark.parametrize("domain", ["log", "auto"])
def test_default_is_the_paper_kernel_and_eq6(mu, domain):
  rng = np.random.default_rng(13)
  hidden = rng.normal(size=(2, N + M, 32)).astype(np.float32)
  sims = np.einsum("bie,bje->bij", hidden[:, :N], hidden[:, N:])  # dot products, ~30% negative
  masks = np.stack([_ragged_mask(N, M), _ragged_mask(4, 6)])
  result = solve(sims, masks, mu=mu, domain=domain)  # clamped, rows first, 2 iterations
  for k, (rows, cols) in enumerate([(N, M), (4, 6)]):
    plan, after_u = _numpy_paper(sims[k, :rows, :cols], 2, mu)
    np.testing.assert_allclose(np.asarray(result.plan)[k, :rows, :cols], plan, rtol=5e-5, atol=1e-12)
    np.testing.assert_allclose(np.asarray(result.row_plan)[k, :rows, :cols], after_u, rtol=5e-5,
                               atol=1e-12)
    np.testing.assert_allclose(np.asarray(result.log_plan)[k, :rows, :cols], np.log(plan), atol=2e-4)
    # All-ones marginals: the last step makes every column sum to 1, the u step every row.
    np.testing.assert_allclose(plan.sum(0), np.ones(cols), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(result.row_plan)[k, :rows, :cols].sum(1), np.ones(rows), rtol=1e-5)
  np.testing.assert_array_equal(result.col_plan, result.plan)
  for field in result:
    assert np.all(np.asarray(field)[~masks] == (LOG_ZERO if field is result.log_plan else 0.0))


def test_relative_mu_scales_the_temperature_by_each_problems_mean_abs_similarity():
  sim, mask, row_seg, col_seg, blocks = _packed_problem(np.random.default_rng(14))
  sim = 80 * sim  # raw-dot-product scale
  relative = np.asarray(solve(sim, mask, mu=0.5, kernel="entropic", row_segments=row_seg,
                              col_segments=col_seg).plan)
  for rows, cols in blocks:
    block = sim[rows, cols]
    temperature = 0.5 * np.mean(np.abs(block))
    expected = _numpy_entropic(block, temperature, 2)
    np.testing.assert_allclose(relative[rows, cols], expected, rtol=5e-5, atol=1e-12)
  # Without segments the whole matrix is one problem: one mean over all valid entries.
  one = np.asarray(solve(sim[:3, :4], np.ones((3, 4), bool), mu=0.5, kernel="entropic").plan)
  expected = _numpy_entropic(sim[:3, :4], 0.5 * np.mean(np.abs(sim[:3, :4])), 2)
  np.testing.assert_allclose(one, expected, rtol=5e-5, atol=1e-12)


def test_small_mu_recovers_the_optimal_assignment():
  rng = np.random.default_rng(3)
  size, batch = 9, 4
  sims = np.stack([np.eye(size)[rng.permutation(size)] for _ in range(batch)])
  sims = (sims + 0.6 * rng.uniform(size=sims.shape)).astype(np.float32)
  plans = np.asarray(entropic(sims, np.ones_like(sims, bool), mu=0.01, num_iters=300).plan)
  for sim, plan in zip(sims, plans):
    rows, cols = linear_sum_assignment(-sim)
    np.testing.assert_array_equal(plan.argmax(1)[rows], cols)
    np.testing.assert_allclose(plan[rows, cols], 1 / size, rtol=1e-3)


@pytest.mark.fast("entropic-rows_first", "clamped-columns_first")  # Each kernel and each order once.
@pytest.mark.parametrize("order", ["rows_first", "columns_first"])
@pytest.mark.parametrize("kernel", ["entropic", "clamped"])
def test_padding_is_exactly_zero_and_log_plan_finite(kernel, order):
  rng = np.random.default_rng(4)
  sims = rng.normal(size=(6, N, M)).astype(np.float32)
  masks = rng.uniform(size=(6, N, M)) < 0.6
  masks[0] = False  # all masked
  masks[1, 2] = False  # an empty row
  masks[1, :, 3] = False  # an empty column
  # (The clamped kernel at mu = 0.1 makes eps^10 = 1e-60 entries, which underflow.)
  result = solve(sims, masks, mu=0.1 if kernel == "entropic" else 1.0, num_iters=3, kernel=kernel,
                 order=order)
  plan, log_plan = np.asarray(result.plan), np.asarray(result.log_plan)
  assert np.all(np.isfinite(plan)) and np.all(np.isfinite(log_plan))
  assert np.all(plan[~masks] == 0.0) and np.all(log_plan[~masks] == LOG_ZERO)
  assert np.all(plan[masks] > 0.0)
  assert np.all(plan[0] == 0.0)
  for other in (result.row_plan, result.col_plan):
    other = np.asarray(other)
    assert np.all(np.isfinite(other)) and np.all(other[~masks] == 0.0) and np.all(other[masks] > 0.0)


def test_length_one_sides():
  sim = np.arange(N * M, dtype=np.float32).reshape(N, M) / 10
  shapes = [(1, M), (N, 1), (1, 1), (1, 3)]
  masks = np.stack([_ragged_mask(r, c) for r, c in shapes])
  sims = np.broadcast_to(sim, masks.shape)
  uniform = np.asarray(entropic(sims, masks, mu=0.5, num_iters=2).plan)
  clamped = np.asarray(released(sims, masks, num_iters=2).plan)
  paper = np.asarray(solve(sims, masks).plan)
  # One row: it gets all of b (uniform); one column: it gets all of a.
  np.testing.assert_allclose(uniform[0, 0], np.full(M, 1 / M), rtol=1e-6)
  np.testing.assert_allclose(uniform[1, :, 0], np.full(N, 1 / N), rtol=1e-6)
  assert uniform[2, 0, 0] == pytest.approx(1.0)
  np.testing.assert_allclose(clamped[0, 0], np.full(M, 1 / M), rtol=1e-6)
  np.testing.assert_allclose(clamped[1, :, 0], np.ones(N), rtol=1e-6)
  assert clamped[2, 0, 0] == pytest.approx(1.0)
  # Ones marginals, rows first: a single row carries 1 per column, a single column 1.
  np.testing.assert_allclose(paper[0, 0], np.ones(M), rtol=1e-6)
  np.testing.assert_allclose(paper[1, :, 0], np.full(N, 1 / N), rtol=1e-6)
  assert paper[2, 0, 0] == pytest.approx(1.0)
  for k, (rows, cols) in enumerate(shapes):
    for plan in (uniform, clamped, paper):
      assert np.all(plan[k][~masks[k]] == 0)
    np.testing.assert_allclose(uniform[k].sum(), 1.0, rtol=1e-6)


@pytest.mark.fast("0.01")  # The small temperature: the largest exponents.
@pytest.mark.parametrize("mu", [1.0, 0.01])
def test_large_similarities_stay_finite(mu):
  rng = np.random.default_rng(5)
  sims = (500 * rng.normal(size=(2, N, M))).astype(np.float32)
  masks = np.stack([_ragged_mask(N, M), _ragged_mask(3, 4)])
  for kernel in ("entropic", "clamped"):
    for relative_mu in (True, False):
      result = solve(sims, masks, mu=mu, num_iters=2, kernel=kernel, relative_mu=relative_mu)
      for field in result:
        assert np.all(np.isfinite(field))
  plan = np.asarray(entropic(sims, masks, mu=mu, num_iters=2).plan)
  np.testing.assert_allclose(plan[0].sum(0), np.full(M, 1 / M), rtol=1e-5)
  np.testing.assert_allclose(plan[1, :3, :4].sum(0), np.full(4, 1 / 4), rtol=1e-5)


def test_bfloat16_input_is_computed_in_float32():
  sim = np.random.default_rng(6).normal(size=(N, M)).astype(np.float32)
  mask = np.ones((N, M), bool)
  low = entropic(jnp.asarray(sim, jnp.bfloat16), mask, mu=0.5, num_iters=2).plan
  assert low.dtype == jnp.float32
  full = entropic(np.asarray(jnp.asarray(sim, jnp.bfloat16), np.float32), mask, mu=0.5, num_iters=2)
  np.testing.assert_allclose(low, full.plan, rtol=1e-6)


def test_leading_batch_dims_and_vmap_match_single_problems():
  rng = np.random.default_rng(7)
  sims = rng.normal(size=(2, 3, N, M)).astype(np.float32)
  masks = rng.uniform(size=(2, 3, N, M)) < 0.8
  batched = solve(sims, masks, mu=0.5, num_iters=3, kernel="entropic").plan
  one = functools.partial(ops_sinkhorn, mu=0.5, num_iters=3, kernel="entropic")
  vmapped = jax.jit(jax.vmap(jax.vmap(lambda s, m: one(s, m).plan)))(sims, masks)
  singles = np.stack([
      np.stack([np.asarray(solve(sims[i, j], masks[i, j], mu=0.5, num_iters=3, kernel="entropic").plan)
                for j in range(3)]) for i in range(2)])
  np.testing.assert_allclose(batched, singles, rtol=1e-6, atol=1e-9)
  np.testing.assert_allclose(vmapped, singles, rtol=1e-6, atol=1e-9)


def _packed_problem(rng):
  """Two problems (3x4 and 2x3) on the diagonal of a 6x8 matrix, then padding."""
  row_segments = np.array([1, 1, 1, 2, 2, 0])
  col_segments = np.array([1, 1, 1, 1, 2, 2, 2, 0])
  mask = (row_segments[:, None] == col_segments[None, :]) & (row_segments[:, None] > 0)
  sim = rng.normal(size=mask.shape).astype(np.float32)
  blocks = [(slice(0, 3), slice(0, 4)), (slice(3, 5), slice(4, 7))]
  return sim, mask, row_segments, col_segments, blocks


def test_block_diagonal_marginals_and_plans_match_per_block_calls():
  sim, mask, row_seg, col_seg, blocks = _packed_problem(np.random.default_rng(8))
  a, b = marginals(mask, row_segments=row_seg, col_segments=col_seg)
  np.testing.assert_allclose(a, [1 / 3] * 3 + [1 / 2] * 2 + [0], rtol=1e-6)
  np.testing.assert_allclose(b, [1 / 4] * 4 + [1 / 3] * 3 + [0], rtol=1e-6)
  packed = np.asarray(entropic(sim, mask, mu=0.5, num_iters=2, row_marginal=a, col_marginal=b).plan)
  by_segments = np.asarray(entropic(sim, mask, mu=0.5, num_iters=2, row_segments=row_seg,
                                    col_segments=col_seg).plan)
  np.testing.assert_array_equal(by_segments, packed)
  clamped = np.asarray(released(sim, mask, num_iters=2).plan)
  paper = np.asarray(solve(sim, mask).plan)
  for rows, cols in blocks:
    block_mask = np.ones_like(sim[rows, cols], bool)
    alone = entropic(sim[rows, cols], block_mask, mu=0.5, num_iters=2).plan
    np.testing.assert_allclose(packed[rows, cols], alone, rtol=1e-5)
    alone = released(sim[rows, cols], block_mask, num_iters=2).plan
    np.testing.assert_allclose(clamped[rows, cols], alone, rtol=1e-5)
    alone = solve(sim[rows, cols], block_mask).plan
    np.testing.assert_allclose(paper[rows, cols], alone, rtol=1e-5)
  assert np.all(packed[~mask] == 0) and np.all(clamped[~mask] == 0) and np.all(paper[~mask] == 0)


def test_uniform_marginals_without_segments():
  mask = _ragged_mask(3, 6)
  mask[1] = False  # a hole: row 1 has no valid entry
  a, b = marginals(mask)
  np.testing.assert_allclose(a, [0.5, 0, 0.5, 0, 0], rtol=1e-6)
  np.testing.assert_allclose(b, [1 / 6] * 6 + [0], rtol=1e-6)


def test_invalid_arguments_raise():
  sim, mask = np.zeros((2, 3), np.float32), np.ones((2, 3), bool)
  with pytest.raises(ValueError, match="kernel"):
    ops_sinkhorn(sim, mask, kernel="sparse")
  with pytest.raises(ValueError, match="domain"):
    ops_sinkhorn(sim, mask, domain="exp")
  with pytest.raises(ValueError, match="num_iters"):
    ops_sinkhorn(sim, mask, num_iters=0)
  with pytest.raises(ValueError, match="order"):
    ops_sinkhorn(sim, mask, order="diagonal")
  with pytest.raises(ValueError, match="mu"):
    ops_sinkhorn(sim, mask, mu=0.0)
  with pytest.raises(ValueError, match="segments"):
    ops_sinkhorn(sim, mask, row_segments=np.zeros(2, np.int32))


def _ragged_batch(rng, batch=6, n=N + 4, m=M + 6):
  """Random masks with an all-masked problem, an empty row and column, a full one."""
  masks = rng.uniform(size=(batch, n, m)) < 0.7
  masks[0] = False
  masks[1, 2] = False
  masks[1, :, 3] = False
  masks[2] = True
  masks[3] = _ragged_mask(1, 4, n, m)
  return masks


def _assert_same_result(result, expected, masks, log_atol=1e-5):
  plan, log_plan = np.asarray(result.plan), np.asarray(result.log_plan)
  assert np.all(np.isfinite(plan)) and np.all(np.isfinite(log_plan))
  assert np.all(plan[~masks] == 0.0) and np.all(log_plan[~masks] == LOG_ZERO)
  np.testing.assert_allclose(plan, expected.plan, rtol=2e-5, atol=1e-8)
  for name in ("row_plan", "col_plan"):
    other = np.asarray(getattr(result, name))
    assert np.all(other[~masks] == 0.0), name
    np.testing.assert_allclose(other, getattr(expected, name), rtol=2e-5, atol=1e-8, err_msg=name)
  np.testing.assert_allclose(np.where(masks, log_plan, 0.0),
                             np.where(masks, expected.log_plan, 0.0), rtol=1e-5, atol=log_atol)


# Each iteration count, kernel/order pair and domain once (the entropic "auto" case at mu = 0.02 is the one
# that may fall back to the log domain); the full grid runs in the slow tier.
@pytest.mark.fast("7-entropic-rows_first-auto", "1-clamped-columns_first-scaling", "2-clamped-rows_first-scaling")
@pytest.mark.parametrize("domain", ["scaling", "auto"])
@pytest.mark.parametrize("kernel,order", [("entropic", "rows_first"), ("clamped", "columns_first"),
                                          ("clamped", "rows_first")])
@pytest.mark.parametrize("num_iters", [1, 2, 7])
def test_scaling_domain_matches_log_domain_on_moderate_ranges(domain, kernel, order, num_iters):
  rng = np.random.default_rng(10)
  masks = _ragged_batch(rng)
  sims = rng.uniform(-1, 1, size=masks.shape).astype(np.float32)  # cosines
  # entropic: up to 100 nats at mu = 0.02, so "auto" may fall back; clamped:
  # log(1e-6) .. 0 is 14 nats at mu = 1, 46 at mu = 0.3.
  for mu in ((0.1, 0.02) if kernel == "entropic" else (1.0, 0.3)):
    kwargs = {"mu": mu, "num_iters": num_iters, "kernel": kernel, "order": order, "relative_mu": False}
    expected = solve(sims, masks, **kwargs)
    result = solve(sims, masks, domain=domain, **kwargs)
    _assert_same_result(result, expected, masks)


def test_scaling_domain_with_given_marginals_and_many_iterations():
  # 70 nats at mu = 0.01 and 300 iterations: float32 rounding is amplified
  # (~1e-5 of the largest entry) in either domain, so both are held to the
  # same float64 reference rather than to each other.
  rng = np.random.default_rng(11)
  sims = rng.uniform(0, 0.7, size=(3, N, M)).astype(np.float32)
  masks = np.ones_like(sims, bool)
  masks[1, 3:] = False
  a = rng.uniform(0.5, 1.5, size=(3, N)).astype(np.float32)
  b = rng.uniform(0.5, 1.5, size=(3, M)).astype(np.float32)
  a[:, 0] = 0.0  # a row without mass
  kwargs = {"mu": 0.01, "num_iters": 300, "row_marginal": a, "col_marginal": b, "kernel": "entropic",
            "relative_mu": False}
  for domain in ("log", "scaling", "auto"):
    result = solve(sims, masks, domain=domain, **kwargs)
    plan, log_plan = np.asarray(result.plan), np.asarray(result.log_plan)
    assert np.all(np.isfinite(log_plan)) and np.all(plan[~masks] == 0.0) and np.all(plan[:, 0] == 0)
    for k, rows in enumerate([N, 3, N]):
      expected = _numpy_entropic(sims[k, 1:rows], 0.01, 300, a[k, 1:rows], b[k])
      np.testing.assert_allclose(plan[k, 1:rows], expected, atol=1e-4 * expected.max(),
                                 err_msg=f"{domain}, problem {k}")


@pytest.mark.fast("0.01")
@pytest.mark.parametrize("mu", [1.0, 0.01])
def test_auto_falls_back_to_log_domain_on_large_similarities(mu):
  rng = np.random.default_rng(5)
  sims = (500 * rng.normal(size=(2, N, M))).astype(np.float32)
  masks = np.stack([_ragged_mask(N, M), _ragged_mask(3, 4)])
  expected = entropic(sims, masks, mu=mu, num_iters=2)
  # The fallback's log_plan is log K + f + g: float32 rounding of |S / mu|.
  log_atol = 4 * np.finfo(np.float32).eps * np.max(np.abs(sims)) / mu
  _assert_same_result(entropic(sims, masks, mu=mu, num_iters=2, domain="auto"), expected, masks,
                      log_atol=log_atol)
  # Scaling alone is not safe here: that is what "auto" checks.
  assert not np.all(np.isfinite(entropic(sims, masks, mu=mu, num_iters=2, domain="scaling").plan))


def test_auto_falls_back_when_a_sum_underflows_within_the_range_limit():
  # 79 nats (under the range limit), but row 1's kernel entries are e^-79 of
  # the peak: its row sum is < 1e-25, so terms could flush; auto must notice.
  sim = np.zeros((N, M), np.float32)
  sim[0, 0] = 0.79
  mask = np.ones((N, M), bool)
  mask[1:, 0] = False
  expected = entropic(sim, mask, mu=0.01, num_iters=3)
  _assert_same_result(entropic(sim, mask, mu=0.01, num_iters=3, domain="auto"), expected, mask)


def test_auto_under_vmap_matches_batched():
  rng = np.random.default_rng(12)
  sims = rng.uniform(-1, 1, size=(4, N, M)).astype(np.float32)
  sims[3] *= 500  # one problem needs the log domain
  masks = rng.uniform(size=sims.shape) < 0.8
  auto = functools.partial(ops_sinkhorn, mu=0.1, num_iters=3, domain="auto", kernel="entropic",
                           relative_mu=False)
  vmapped = jax.jit(jax.vmap(lambda s, m: auto(s, m).plan))(sims, masks)
  expected = entropic(sims, masks, mu=0.1, num_iters=3).plan
  np.testing.assert_allclose(vmapped, expected, rtol=2e-5, atol=1e-8)
  np.testing.assert_allclose(jax.jit(auto)(sims[:3], masks[:3]).plan, expected[:3],
                             rtol=2e-5, atol=1e-8)
