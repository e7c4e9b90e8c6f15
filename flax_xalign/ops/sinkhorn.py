"""Masked, batched Sinkhorn scaling in the log domain (XLM-Align's OT step).

XLM-Align (Chi et al., 2021) turns the token similarity matrix `S` of a
translation pair into a soft alignment with a few Sinkhorn iterations and then
reads word alignments off it with itermax. Two kernels are provided:

* `kernel="entropic"` (the default) is the paper's formulation (Eq. 3-6):
  entropic optimal transport with kernel `K = exp(S / mu)`, marginals `a, b`
  (uniform over the real tokens unless given), `v^0 = 1` and, per iteration,
  a row step `u = a / (K v)` followed by a column step `v = b / (K^T u)`; the
  plan is `diag(u) K diag(v)`. It is the default because it is standard
  entropic OT: at convergence it is the plan POT's `ot.sinkhorn(a, b, -S, mu)`
  computes, so it can be tested against an independent solver, and `mu`
  moves it between a soft alignment and an assignment.
* `kernel="clamped"` follows the released XLM-Align code (microsoft/unilm,
  infoxlm `_sinkhorn_iter`): `K = max(clamp_epsilon, S)` with no `mu`, all-ones
  marginals and, per iteration, column normalisation followed by row
  normalisation; the result is the row-normalised plan. The paper's Eq. (1)
  defines `f_sim = log max(eps, h_i . h_j)` (printed with a leading minus sign
  that reads as a typo) and at `mu = 1`, `exp(f_sim / mu) = max(eps, S)`: so
  this kernel is also the literal reading of Eq. (1) at `mu = 1`, with the
  code's column-first order.

Both run the same solver on log-kernels and potentials (log-sum-exp steps), so
they stay finite for raw dot products of hidden states (|S| ~ 500) and for
small `mu` (0.01). Iteration counts are fixed (`lax.scan`, no convergence
test), so the functions `jit` and `vmap` with static shapes; only the last two
axes are the problem, any leading axes are batch axes.

Padding is given by `mask` (True = a real token pair). Masked entries carry no
mass: `plan` is exactly 0 there and `log_plan` is `LOG_ZERO` (finite, so that
`plan * log_plan` and friends stay free of NaN). Rows and columns without a
valid entry, and all-False masks, give all-zero plans.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

# Log of "no mass": finite so that sums and products with it stay NaN-free, and
# far below any log-kernel value a real problem produces (|S / mu| << 1e29).
LOG_ZERO = -1e30

KERNELS = ("entropic", "clamped")


class SinkhornResult(NamedTuple):
  """Output of `sinkhorn`.

  Attributes:
    plan: [..., n, m] float32 transport plan; exactly 0 where `~mask`.
    log_plan: [..., n, m] float32 log of `plan`; `LOG_ZERO` where `~mask`.
  """

  plan: jax.Array
  log_plan: jax.Array


def _count_in_segment(real: jax.Array, segments: jax.Array | None) -> jax.Array:
  """How many real entries share each entry's segment.

  Args:
    real: [..., k] bool.
    segments: [..., k] int segment ids, or None for a single segment.

  Returns:
    [..., k] float32 counts (over the whole axis when `segments` is None).
  """
  real = real.astype(jnp.float32)
  if segments is None:
    return jnp.broadcast_to(jnp.sum(real, axis=-1, keepdims=True), real.shape)
  same = segments[..., :, None] == segments[..., None, :]
  return jnp.einsum("...kl,...l->...k", same.astype(jnp.float32), real)


def uniform_marginals(
    mask: jax.Array,
    *,
    row_segments: jax.Array | None = None,
    col_segments: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
  """Uniform weights over the real rows and the real columns of `mask`.

  A row (column) is real when it has at least one valid entry. With segment
  ids the matrix packs several independent problems on its block diagonal and
  each block gets its own uniform marginals, summing to 1 per block.

  Args:
    mask: [..., n, m] bool, True on valid entries.
    row_segments: optional [..., n] int segment id of each row.
    col_segments: optional [..., m] int segment id of each column.

  Returns:
    (a, b): [..., n] and [..., m] float32; `a_i = 1 / #real rows in i's
    segment` on real rows and 0 elsewhere, likewise `b`.
  """
  mask = jnp.asarray(mask, dtype=bool)
  row_real = jnp.any(mask, axis=-1)
  col_real = jnp.any(mask, axis=-2)
  row_count = _count_in_segment(row_real, row_segments)
  col_count = _count_in_segment(col_real, col_segments)
  a = jnp.where(row_real, 1.0 / jnp.maximum(row_count, 1.0), 0.0)
  b = jnp.where(col_real, 1.0 / jnp.maximum(col_count, 1.0), 0.0)
  return a, b


def _safe_log(x: jax.Array) -> jax.Array:
  return jnp.where(x > 0, jnp.log(jnp.where(x > 0, x, 1.0)), LOG_ZERO)


def _potential_step(log_kernel, other, log_marginal, axis):
  """One scaling step in the log domain, reducing over `axis`.

  For axis=-1 (row step) this is `f = log a - logsumexp_j(log K_ij + g_j)`,
  for axis=-2 (column step) `g = log b - logsumexp_i(log K_ij + f_i)`.

  Args:
    log_kernel: [..., n, m] log-kernel, `LOG_ZERO` on masked entries.
    other: the opposite potential, [..., m] for axis=-1 or [..., n] for -2.
    log_marginal: [..., n] for axis=-1 or [..., m] for axis=-2.
    axis: -1 or -2.

  Returns:
    (potential, shifted, exp_shifted, log_norm): the new potential, `log K +
    other - max` and its exp (both [..., n, m]), and the log of the sum of
    the latter along `axis` (keepdims), from which the caller forms the plan.
  """
  z = log_kernel + jnp.expand_dims(other, axis=-1 if axis == -2 else -2)
  peak = jnp.max(z, axis=axis, keepdims=True)
  shifted = z - peak
  exp_shifted = jnp.exp(shifted)
  log_norm = jnp.log(jnp.sum(exp_shifted, axis=axis, keepdims=True))
  potential = log_marginal - jnp.squeeze(peak + log_norm, axis=axis)
  return potential, shifted, exp_shifted, log_norm


def _drop_unreachable_mass(mask, a, b):
  """Restricts given marginals to mass that valid entries can carry.

  Entries in a row or column without mass are taken out of the mask, and
  then rows and columns left without a valid entry lose their mass. Uniform
  marginals satisfy this already; the solver relies on it to leave masked
  entries at exactly 0 without a final select over [..., n, m].

  Args:
    mask: [..., n, m] bool.
    a: [..., n] row marginals.
    b: [..., m] column marginals.

  Returns:
    (mask, a, b) restricted.
  """
  mask = mask & (a > 0)[..., :, None] & (b > 0)[..., None, :]
  a = jnp.where(jnp.any(mask, axis=-1), a, 0.0)
  b = jnp.where(jnp.any(mask, axis=-2), b, 0.0)
  return mask, a, b


def _sinkhorn_log(
    log_kernel: jax.Array,
    mask: jax.Array,
    log_a: jax.Array,
    log_b: jax.Array,
    *,
    num_iters: int,
    rows_first: bool,
) -> SinkhornResult:
  """Fixed-count Sinkhorn scaling of a masked log-kernel.

  Each iteration is a row step and a column step (`rows_first`) or the other
  way round; the first potential to be updated starts from the other one at
  zero (scaling vector of ones). The plan is read off the last step: its
  exponentials normalised along the step's axis, times the marginal, which is
  `exp(log K + f + g)` with that step's potential.

  Args:
    log_kernel: [..., n, m] float32, `LOG_ZERO` where `~mask`.
    mask: [..., n, m] bool.
    log_a: [..., n] log row marginals (`LOG_ZERO` for zero mass).
    log_b: [..., m] log column marginals.
    num_iters: static number of iterations (>= 1).
    rows_first: True for row-then-column iterations.

  Returns:
    SinkhornResult after the second step of the last iteration.
  """
  first_axis, second_axis = (-1, -2) if rows_first else (-2, -1)
  first_marginal, second_marginal = (log_a, log_b) if rows_first else (log_b, log_a)
  # The potential the first step reads: g for a row step, f for a column step.
  second_potential = jnp.zeros_like(second_marginal)

  def iteration(second, _):
    first, *_ = _potential_step(log_kernel, second, first_marginal, first_axis)
    second, *_ = _potential_step(log_kernel, first, second_marginal, second_axis)
    return second, None

  second_potential, _ = jax.lax.scan(
      iteration, second_potential, None, length=num_iters - 1)
  first, *_ = _potential_step(log_kernel, second_potential, first_marginal, first_axis)
  _, shifted, exp_shifted, log_norm = _potential_step(
      log_kernel, first, second_marginal, second_axis)
  marginal = jnp.expand_dims(second_marginal, axis=second_axis)
  log_plan = jnp.where(mask, shifted - log_norm + marginal, LOG_ZERO)
  # No select needed: a masked entry has log K = LOG_ZERO, so its exponential
  # underflows to 0 in any row/column with a valid entry, and the marginal is
  # exactly 0 (LOG_ZERO) on rows/columns without one. This saves a pass.
  plan = exp_shifted * jnp.exp(marginal - log_norm)
  return SinkhornResult(plan=plan, log_plan=log_plan)


def sinkhorn(
    similarity: jax.Array,
    mask: jax.Array,
    *,
    mu: float = 1.0,
    num_iters: int = 2,
    kernel: str = "entropic",
    clamp_epsilon: float = 1e-6,
    row_marginal: jax.Array | None = None,
    col_marginal: jax.Array | None = None,
) -> SinkhornResult:
  """Soft alignment of the rows and columns of a masked similarity matrix.

  Args:
    similarity: [..., n, m] similarities (any float dtype; computed in f32).
    mask: [..., n, m] bool, True on real token pairs.
    mu: entropic regularisation (`kernel="entropic"` only): `K = exp(S / mu)`.
    num_iters: number of (row, column) iteration pairs, static, >= 1.
    kernel: "entropic" (paper Eq. 3-6, default) or "clamped" (released code).
    clamp_epsilon: floor of `K = max(clamp_epsilon, S)` for "clamped".
    row_marginal: optional [..., n] `a` for "entropic"; default uniform over
      real rows (`uniform_marginals`). Mass on rows without a valid entry in
      a column with mass is dropped.
    col_marginal: optional [..., m] `b` for "entropic"; default likewise.

  Returns:
    SinkhornResult with `plan` and `log_plan`, [..., n, m] float32. For
    "entropic" the columns of the plan sum to `b` exactly (the last step is a
    column step); for "clamped" every real row sums to 1.

  Raises:
    ValueError: unknown kernel, `num_iters < 1`, or marginals given with
      `kernel="clamped"` (its marginals are all ones).
  """
  if kernel not in KERNELS:
    raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
  if num_iters < 1:
    raise ValueError(f"num_iters must be >= 1, got {num_iters}")
  similarity = jnp.asarray(similarity).astype(jnp.float32)
  mask = jnp.broadcast_to(jnp.asarray(mask, dtype=bool), similarity.shape)
  if kernel == "entropic":
    a, b = uniform_marginals(mask)
    if row_marginal is not None or col_marginal is not None:
      if row_marginal is not None:
        a = jnp.asarray(row_marginal, jnp.float32)
      if col_marginal is not None:
        b = jnp.asarray(col_marginal, jnp.float32)
      mask, a, b = _drop_unreachable_mass(mask, a, b)
    log_kernel = jnp.where(mask, similarity / mu, LOG_ZERO)
    return _sinkhorn_log(log_kernel, mask, _safe_log(a), _safe_log(b),
                         num_iters=num_iters, rows_first=True)
  if row_marginal is not None or col_marginal is not None:
    raise ValueError("kernel='clamped' uses all-ones marginals; "
                     "row_marginal/col_marginal are not supported")
  log_kernel = jnp.where(
      mask, jnp.log(jnp.maximum(similarity, clamp_epsilon)), LOG_ZERO)
  log_ones = jnp.where(jnp.any(mask, axis=-1), 0.0, LOG_ZERO)
  log_ones_cols = jnp.where(jnp.any(mask, axis=-2), 0.0, LOG_ZERO)
  return _sinkhorn_log(log_kernel, mask, log_ones, log_ones_cols,
                       num_iters=num_iters, rows_first=False)
