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

Both run the same solver on log-kernels and potentials. `domain="log"` (the
default) takes a log-sum-exp per half-step, so it stays finite for raw dot
products of hidden states (|S| ~ 500) and for small `mu` (0.01). For kernels
of moderate dynamic range, `domain="scaling"` exponentiates the kernel once
(shifted by its maximum per problem) and turns each half-step into a
matrix-vector product with the exponentiated, max-shifted potential; the
potentials stay in the log domain, so only the kernel's range matters, not
the iteration count. It gives the log domain's result within float32
rounding as long as no sum underflows, with one `exp` pass instead of one
per half-step (measured ~1.5x faster at 2 iterations, ~6x at 20).
`domain="auto"` checks that per batch and falls back to the log domain (see
`sinkhorn`). Iteration counts are fixed (`lax.scan`, no convergence test), so
the functions `jit` and `vmap` with static shapes; only the last two axes are
the problem, any leading axes are batch axes.

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
DOMAINS = ("log", "scaling", "auto")

# `domain="auto"` takes the scaling domain when, in every problem, the valid
# log-kernel spans at most this many nats (the kernel then has no subnormal
# entries, e^-80 ~ 2e-35) ...
_SCALING_MAX_RANGE = 80.0
# ... and afterwards every row/column sum with mass was at least this: a
# float32 term that flushes to zero (< 1.2e-38) is then < 1e-13 of its sum, so
# nothing the log domain would see is lost.
_SCALING_MIN_SUM = 1e-25
_TINY = float(jnp.finfo(jnp.float32).tiny)


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
) -> tuple[SinkhornResult, jax.Array, jax.Array]:
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
    (result, f, g): SinkhornResult after the second step of the last
    iteration and the row and column potentials it was formed with.
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
  second, shifted, exp_shifted, log_norm = _potential_step(
      log_kernel, first, second_marginal, second_axis)
  marginal = jnp.expand_dims(second_marginal, axis=second_axis)
  log_plan = jnp.where(mask, shifted - log_norm + marginal, LOG_ZERO)
  # No select needed: a masked entry has log K = LOG_ZERO, so its exponential
  # underflows to 0 in any row/column with a valid entry, and the marginal is
  # exactly 0 (LOG_ZERO) on rows/columns without one. This saves a pass.
  plan = exp_shifted * jnp.exp(marginal - log_norm)
  f, g = (first, second) if rows_first else (second, first)
  return SinkhornResult(plan=plan, log_plan=log_plan), f, g


def _kernel_matvec(kernel, weights, axis):
  """`sum_j K_ij w_j` (axis=-1) or `sum_i K_ij w_i` (axis=-2), as a dot."""
  if axis == -1:
    return jnp.einsum("...ij,...j->...i", kernel, weights)
  return jnp.einsum("...ij,...i->...j", kernel, weights)


def _scaling_step(kernel, shift, other, log_marginal, axis):
  """One scaling step on `kernel = exp(log K - shift)`, potentials in logs.

  `f = log a - shift - peak - log sum_j K~_ij exp(g_j - peak)` with `peak`
  the largest `g` (row step, axis=-1), likewise for columns; rows without
  mass get `LOG_ZERO` so that they never set the next step's peak.

  Args:
    kernel: [..., n, m] `exp(log K - shift)`, 0 on masked entries.
    shift: [..., 1] the per-problem kernel shift.
    other: [..., m] (axis=-1) or [..., n] (axis=-2) opposite potential.
    log_marginal: [..., n] or [..., m].
    axis: -1 or -2.

  Returns:
    (potential, weights, total): the new potential, `exp(other - peak)` and
    the sums it was divided by (0 without mass).
  """
  peak = jnp.max(other, axis=-1, keepdims=True)
  peak = jnp.where(peak > 0.5 * LOG_ZERO, peak, 0.0)  # nothing has mass
  weights = jnp.exp(other - peak)
  total = _kernel_matvec(kernel, weights, axis)
  has_mass = log_marginal > 0.5 * LOG_ZERO
  # Clamped so that a failed (underflowed) step stays finite for `auto`.
  log_total = jnp.log(jnp.where(has_mass, jnp.maximum(total, _TINY), 1.0))
  potential = jnp.where(has_mass, log_marginal - shift - peak - log_total, LOG_ZERO)
  return potential, weights, jnp.where(has_mass, total, jnp.inf)


def _scaling_potentials(kernel, shift, log_a, log_b, *, num_iters, rows_first):
  """`_sinkhorn_log`'s iterations on `kernel = exp(log K - shift)`.

  Args:
    kernel: [..., n, m] exponentiated shifted kernel, 0 on masked entries.
    shift: [...] the per-problem shift.
    log_a, log_b, num_iters, rows_first: as `_sinkhorn_log`.

  Returns:
    (f, g, weights, total, ok): the potentials, the last step's weights and
    sums (for `_scaling_plan`), and [...] bool, False for problems where a
    row or column sum with mass fell below `_SCALING_MIN_SUM` (terms may
    have flushed to zero, so the log domain may differ).
  """
  first_axis, second_axis = (-1, -2) if rows_first else (-2, -1)
  first_marginal, second_marginal = (log_a, log_b) if rows_first else (log_b, log_a)
  shift = shift[..., None]

  def half_steps(second, ok):
    first, _, total = _scaling_step(kernel, shift, second, first_marginal, first_axis)
    ok = ok & jnp.all(total >= _SCALING_MIN_SUM, axis=-1)
    second, weights, total = _scaling_step(kernel, shift, first, second_marginal, second_axis)
    ok = ok & jnp.all(total >= _SCALING_MIN_SUM, axis=-1)
    return first, second, weights, total, ok

  def iteration(carry, _):
    second, ok = carry
    _, second, _, _, ok = half_steps(second, ok)
    return (second, ok), None

  ok = jnp.ones(kernel.shape[:-2], bool)
  (second, ok), _ = jax.lax.scan(
      iteration, (jnp.zeros_like(second_marginal), ok), None, length=num_iters - 1)
  first, second, weights, total, ok = half_steps(second, ok)
  f, g = (first, second) if rows_first else (second, first)
  return f, g, weights, total, ok


def _scaling_plan(kernel, weights, total, log_a, log_b, *, rows_first):
  """The plan as the last step's terms, normalised: `K~ w marginal / total`.

  Masked entries are exactly 0 because `K~` is; entries below ~1e-38 of
  their row/column flush to 0 (the log domain keeps them in `log_plan`).
  """
  weights_axis, scale_axis = (-1, -2) if rows_first else (-2, -1)
  second_marginal = log_b if rows_first else log_a
  scale = jnp.exp(second_marginal) / total  # total = inf without mass
  return (kernel * jnp.expand_dims(weights, axis=weights_axis)
          * jnp.expand_dims(scale, axis=scale_axis))


def _solve(log_kernel, mask, log_a, log_b, *, num_iters, rows_first, domain):
  """Runs the log or scaling solver per `domain` (see `sinkhorn`)."""
  kwargs = dict(num_iters=num_iters, rows_first=rows_first)
  if domain == "log":
    return _sinkhorn_log(log_kernel, mask, log_a, log_b, **kwargs)[0]
  valid_max = jnp.max(log_kernel, axis=(-2, -1))
  shift = jnp.where(valid_max > 0.5 * LOG_ZERO, valid_max, 0.0)
  kernel = jnp.exp(log_kernel - shift[..., None, None])  # exactly 0 where masked
  f, g, weights, total, ok = _scaling_potentials(kernel, shift, log_a, log_b, **kwargs)
  scaling_plan = lambda: _scaling_plan(kernel, weights, total, log_a, log_b, rows_first=rows_first)
  if domain == "scaling":
    plan = scaling_plan()
  else:
    valid_min = jnp.min(jnp.where(mask, log_kernel, jnp.inf), axis=(-2, -1))
    narrow = (valid_max - valid_min <= _SCALING_MAX_RANGE) | (valid_max < valid_min)

    def log_domain():
      result, f, g = _sinkhorn_log(log_kernel, mask, log_a, log_b, **kwargs)
      return f, g, result.plan

    # `log_plan` is formed after the cond so that it is dropped when unused.
    f, g, plan = jax.lax.cond(jnp.all(narrow & ok), lambda: (f, g, scaling_plan()), log_domain)
  log_plan = jnp.where(mask, log_kernel + f[..., :, None] + g[..., None, :], LOG_ZERO)
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
    domain: str = "log",
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
    domain: "log" (default: a log-sum-exp per half-step, any range),
      "scaling" (one `exp` of the kernel, then matrix-vector products; only
      for kernels whose valid entries span well under ~80 nats, e.g. cosines
      with `mu >= 0.05`) or "auto": scaling when every problem's valid
      log-kernel spans <= 80 nats and no row/column sum with mass fell below
      1e-25, else the log domain for the whole batch
      (`lax.cond`; under `vmap` both run, so batch with leading axes). Its
      `log_plan` is `log K + f + g`, exact to float32 rounding of `|S / mu|`.

  Returns:
    SinkhornResult with `plan` and `log_plan`, [..., n, m] float32. For
    "entropic" the columns of the plan sum to `b` exactly (the last step is a
    column step); for "clamped" every real row sums to 1.

  Raises:
    ValueError: unknown kernel or domain, `num_iters < 1`, or marginals given with
      `kernel="clamped"` (its marginals are all ones).
  """
  if kernel not in KERNELS:
    raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
  if domain not in DOMAINS:
    raise ValueError(f"domain must be one of {DOMAINS}, got {domain!r}")
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
    return _solve(log_kernel, mask, _safe_log(a), _safe_log(b),
                  num_iters=num_iters, rows_first=True, domain=domain)
  if row_marginal is not None or col_marginal is not None:
    raise ValueError("kernel='clamped' uses all-ones marginals; "
                     "row_marginal/col_marginal are not supported")
  log_kernel = jnp.where(
      mask, jnp.log(jnp.maximum(similarity, clamp_epsilon)), LOG_ZERO)
  log_ones = jnp.where(jnp.any(mask, axis=-1), 0.0, LOG_ZERO)
  log_ones_cols = jnp.where(jnp.any(mask, axis=-2), 0.0, LOG_ZERO)
  return _solve(log_kernel, mask, log_ones, log_ones_cols,
                num_iters=num_iters, rows_first=False, domain=domain)
