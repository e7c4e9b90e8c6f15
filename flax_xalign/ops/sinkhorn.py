"""Masked, batched Sinkhorn scaling in the log domain (XLM-Align's OT step).

XLM-Align (Chi et al., 2021, §3.1) turns the token similarity matrix `S` of a
translation pair into a soft alignment with a few Sinkhorn iterations and then
reads word alignments off it (Eq. 7) or with itermax (Eq. 8-9).

Kernels (`kernel=`):

* "clamped" (the default) is the paper's: Eq. (1) defines
  `f_sim = log max(eps, h_i . h_j)` (printed with a leading minus sign, a
  typo: with it, Eq. 2 would prefer dissimilar tokens) and Eq. (5)
  `K = exp(f_sim / mu)`, so `K = max(eps, S)^(1 / mu)`, i.e. `log K =
  log max(eps, S) / mu`. At the paper's `mu = 1` this is `max(eps, S)`, the
  kernel of the released code (microsoft/unilm, infoxlm `_sinkhorn_iter`).
  Its default marginals are Eq. (6)'s all-ones vectors.
* "entropic" is textbook entropic OT, `K = exp(S / T)`, with uniform
  marginals per problem, as POT's `ot.sinkhorn(a, b, -S, T)` and ott-jax
  compute it. Raw dot products of hidden states have |S| ~ 100, so with
  `T = mu = 1` two iterations already put all of a column's mass on its best
  row: a row that is the best row of several columns gets bit-identical
  entries, and an argmax then picks the leftmost of them. So by default
  (`relative_mu=True`) the temperature is scaled to the similarities as
  ott-jax scales epsilon by the mean cost: `T = mu * mean |S|` over the
  problem's valid entries (per packed problem with segment ids);
  `relative_mu=False` gives the absolute `T = mu`.

Order (`order=`): "rows_first" (the default) is Eq. (6): `v^0 = 1`, then per
iteration `u = a / (K v)`, `v = b / (K^T u)`; the plan `A* = diag(u) K diag(v)`
has columns summing to `b`. "columns_first" is the released code's loop:
column normalisation (`xi = pi / pi.sum(0)`), then row normalisation
(`pi = xi / xi.sum(1)`), starting from `pi = K`; its plan has rows summing to
`a`. Besides the plan, `SinkhornResult` holds the last row-normalised and the
last column-normalised iterate (one of them is the plan): the released
aligner reads forward links off the former (`pi`) and backward links off the
latter (`xi`).

Both kernels run the same solver on log-kernels and potentials. `domain="log"`
(the default) takes a log-sum-exp per half-step, so it stays finite for any
range of the log-kernel (raw dot products at small `mu`). For kernels of
moderate dynamic range, `domain="scaling"` exponentiates the kernel once
(shifted by its maximum per problem) and turns each half-step into a
matrix-vector product with the exponentiated, max-shifted potential; the
potentials stay in the log domain, so only the kernel's range matters, not
the iteration count. It gives the log domain's result within float32
rounding as long as no sum underflows, with one `exp` pass instead of one
per half-step. `domain="auto"` checks that per batch and falls back to the
log domain (see `sinkhorn`). Iteration counts are fixed (`lax.scan`, no
convergence test), so the functions `jit` and `vmap` with static shapes; only
the last two axes are the problem, any leading axes are batch axes. With
`row_segments` / `col_segments` one matrix packs several problems on its
block diagonal (the mask must be False off the blocks); each block is solved
as if alone.

Padding is given by `mask` (True = a real token pair). Masked entries carry no
mass: the plans are exactly 0 there and `log_plan` is `LOG_ZERO` (finite, so
that `plan * log_plan` and friends stay free of NaN). Rows and columns without
a valid entry, and all-False masks, give all-zero plans.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

# Log of "no mass": finite so that sums and products with it stay NaN-free, and
# far below any log-kernel value a real problem produces (|S / mu| << 1e29).
LOG_ZERO = -1e30

KERNELS = ("clamped", "entropic")
ORDERS = ("rows_first", "columns_first")
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
    plan: [..., n, m] float32 transport plan `diag(u) K diag(v)` after the
      last step; exactly 0 where `~mask`.
    log_plan: [..., n, m] float32 log of `plan`; `LOG_ZERO` where `~mask`.
    row_plan: [..., n, m] the last iterate right after a row step (rows sum
      to `a`): `plan` for order "columns_first" (the released code's `pi`),
      the iterate before the last column step for "rows_first".
    col_plan: [..., n, m] likewise after the last column step (columns sum
      to `b`): `plan` for "rows_first", the released code's `xi` for
      "columns_first". Unused fields cost nothing under `jit`.
  """

  plan: jax.Array
  log_plan: jax.Array
  row_plan: jax.Array
  col_plan: jax.Array


def _same_segment(row_segments: jax.Array, col_segments: jax.Array) -> jax.Array:
  return row_segments[..., :, None] == col_segments[..., None, :]


def _count_in_segment(real: jax.Array, segments: jax.Array | None) -> jax.Array:
  """How many real entries share each entry's segment.

  Args:
    real: [..., k] bool (or float weights, summed).
    segments: [..., k] int segment ids, or None for a single segment.

  Returns:
    [..., k] float32 counts (over the whole axis when `segments` is None).
  """
  real = real.astype(jnp.float32)
  if segments is None:
    return jnp.broadcast_to(jnp.sum(real, axis=-1, keepdims=True), real.shape)
  same = _same_segment(segments, segments)
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


def mean_abs_similarity(similarity: jax.Array, mask: jax.Array, *,
                        row_segments: jax.Array | None = None) -> jax.Array:
  """Mean |S| over the valid entries of each row's problem.

  Args:
    similarity: [..., n, m] float32.
    mask: [..., n, m] bool; with `row_segments`, False off the diagonal blocks.
    row_segments: optional [..., n] int problem id of each row.

  Returns:
    [..., n] float32, the same for all rows of a problem; 1 where the
    problem has no valid entry or only zeros (any temperature then works).
  """
  row_total = jnp.sum(jnp.where(mask, jnp.abs(similarity), 0.0), axis=-1)
  total = _count_in_segment(row_total, row_segments)
  count = _count_in_segment(jnp.sum(mask, axis=-1), row_segments)
  mean = total / jnp.maximum(count, 1.0)
  return jnp.where(mean > 0, mean, 1.0)


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


def _log_step_plan(exp_shifted, log_norm, log_marginal, axis):
  """The iterate right after a log-domain step along `axis`: `exp(log K + f + g)`.

  No select needed: a masked entry has log K = LOG_ZERO, so its exponential
  underflows to 0 in any row/column with a valid entry, and the marginal is
  exactly 0 (LOG_ZERO) on rows/columns without one. This saves a pass.
  """
  return exp_shifted * jnp.exp(jnp.expand_dims(log_marginal, axis=axis) - log_norm)


def _drop_unreachable_mass(mask, a, b):
  """Restricts given marginals to mass that valid entries can carry.

  Entries in a row or column without mass are taken out of the mask, and
  then rows and columns left without a valid entry lose their mass. Default
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


def _step_axes(rows_first: bool):
  """(first axis, second axis) of an iteration: -1 = row step, -2 = column step."""
  return (-1, -2) if rows_first else (-2, -1)


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
  `exp(log K + f + g)` with that step's potential; the iterate before it is
  read off the last iteration's first step in the same way.

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
  first_axis, second_axis = _step_axes(rows_first)
  first_marginal, second_marginal = (log_a, log_b) if rows_first else (log_b, log_a)
  # The potential the first step reads: g for a row step, f for a column step.
  second_potential = jnp.zeros_like(second_marginal)

  def iteration(second, _):
    first, *_ = _potential_step(log_kernel, second, first_marginal, first_axis)
    second, *_ = _potential_step(log_kernel, first, second_marginal, second_axis)
    return second, None

  second_potential, _ = jax.lax.scan(
      iteration, second_potential, None, length=num_iters - 1)
  first, _, first_exp, first_norm = _potential_step(
      log_kernel, second_potential, first_marginal, first_axis)
  second, shifted, exp_shifted, log_norm = _potential_step(
      log_kernel, first, second_marginal, second_axis)
  marginal = jnp.expand_dims(second_marginal, axis=second_axis)
  log_plan = jnp.where(mask, shifted - log_norm + marginal, LOG_ZERO)
  plan = _log_step_plan(exp_shifted, log_norm, second_marginal, second_axis)
  previous = _log_step_plan(first_exp, first_norm, first_marginal, first_axis)
  f, g = (first, second) if rows_first else (second, first)
  row_plan, col_plan = (previous, plan) if rows_first else (plan, previous)
  return SinkhornResult(plan, log_plan, row_plan, col_plan), f, g


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
    the sums it was divided by (inf without mass).
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


def _scaling_step_plan(kernel, weights, total, log_marginal, axis):
  """The iterate right after a scaling step along `axis`: `K~ w marginal / total`.

  Masked entries are exactly 0 because `K~` is; entries below ~1e-38 of
  their row/column flush to 0 (the log domain keeps them in `log_plan`).
  """
  scale = jnp.exp(log_marginal) / total  # total = inf without mass
  weights_axis = -2 if axis == -1 else -1
  return (kernel * jnp.expand_dims(weights, axis=weights_axis)
          * jnp.expand_dims(scale, axis=axis))


def _scaling_solve(kernel, shift, log_a, log_b, *, num_iters, rows_first):
  """`_sinkhorn_log`'s iterations on `kernel = exp(log K - shift)`.

  Args:
    kernel: [..., n, m] exponentiated shifted kernel, 0 on masked entries.
    shift: [...] the per-problem shift.
    log_a, log_b, num_iters, rows_first: as `_sinkhorn_log`.

  Returns:
    (f, g, plan, row_plan, col_plan, ok): the potentials, the plans, and
    [...] bool, False for problems where a row or column sum with mass fell
    below `_SCALING_MIN_SUM` (terms may have flushed to zero, so the log
    domain may differ).
  """
  first_axis, second_axis = _step_axes(rows_first)
  first_marginal, second_marginal = (log_a, log_b) if rows_first else (log_b, log_a)
  shift = shift[..., None]

  def half_steps(second, ok):
    first, first_weights, first_total = _scaling_step(
        kernel, shift, second, first_marginal, first_axis)
    ok = ok & jnp.all(first_total >= _SCALING_MIN_SUM, axis=-1)
    second, weights, total = _scaling_step(kernel, shift, first, second_marginal, second_axis)
    ok = ok & jnp.all(total >= _SCALING_MIN_SUM, axis=-1)
    return first, second, (first_weights, first_total), (weights, total), ok

  def iteration(carry, _):
    second, ok = carry
    _, second, _, _, ok = half_steps(second, ok)
    return (second, ok), None

  ok = jnp.ones(kernel.shape[:-2], bool)
  (second, ok), _ = jax.lax.scan(
      iteration, (jnp.zeros_like(second_marginal), ok), None, length=num_iters - 1)
  first, second, first_terms, last_terms, ok = half_steps(second, ok)
  plan = _scaling_step_plan(kernel, *last_terms, second_marginal, second_axis)
  previous = _scaling_step_plan(kernel, *first_terms, first_marginal, first_axis)
  f, g = (first, second) if rows_first else (second, first)
  row_plan, col_plan = (previous, plan) if rows_first else (plan, previous)
  return f, g, plan, row_plan, col_plan, ok


def _solve(log_kernel, mask, log_a, log_b, *, num_iters, rows_first, domain):
  """Runs the log or scaling solver per `domain` (see `sinkhorn`)."""
  kwargs = {"num_iters": num_iters, "rows_first": rows_first}
  if domain == "log":
    return _sinkhorn_log(log_kernel, mask, log_a, log_b, **kwargs)[0]
  valid_max = jnp.max(log_kernel, axis=(-2, -1))
  shift = jnp.where(valid_max > 0.5 * LOG_ZERO, valid_max, 0.0)
  kernel = jnp.exp(log_kernel - shift[..., None, None])  # exactly 0 where masked
  f, g, *plans, ok = _scaling_solve(kernel, shift, log_a, log_b, **kwargs)
  if domain == "auto":
    valid_min = jnp.min(jnp.where(mask, log_kernel, jnp.inf), axis=(-2, -1))
    narrow = (valid_max - valid_min <= _SCALING_MAX_RANGE) | (valid_max < valid_min)

    def log_domain():
      result, f, g = _sinkhorn_log(log_kernel, mask, log_a, log_b, **kwargs)
      return f, g, result.plan, result.row_plan, result.col_plan

    # `log_plan` is formed after the cond so that it is dropped when unused.
    f, g, *plans = jax.lax.cond(jnp.all(narrow & ok), lambda: (f, g, *plans), log_domain)
  log_plan = jnp.where(mask, log_kernel + f[..., :, None] + g[..., None, :], LOG_ZERO)
  plan, row_plan, col_plan = plans
  return SinkhornResult(plan, log_plan, row_plan, col_plan)


def log_kernel(
    similarity: jax.Array,
    mask: jax.Array,
    *,
    kernel: str = "clamped",
    mu: float = 1.0,
    relative_mu: bool = True,
    clamp_epsilon: float = 1e-6,
    row_segments: jax.Array | None = None,
) -> jax.Array:
  """`log K` of `sinkhorn` (see the module docstring), `LOG_ZERO` where `~mask`.

  Args:
    similarity: [..., n, m] float32.
    mask: [..., n, m] bool.
    kernel, mu, relative_mu, clamp_epsilon, row_segments: as `sinkhorn`.

  Returns:
    [..., n, m] float32: `log max(eps, S) / mu` ("clamped") or `S / T`
    ("entropic", `T = mu * mean |S|` per problem or `mu`).
  """
  if kernel == "clamped":
    value = jnp.log(jnp.maximum(similarity, clamp_epsilon)) / mu
  else:
    temperature = mu
    if relative_mu:
      temperature = mu * mean_abs_similarity(similarity, mask, row_segments=row_segments)[..., :, None]
    value = similarity / temperature
  return jnp.where(mask, value, LOG_ZERO)


def sinkhorn(
    similarity: jax.Array,
    mask: jax.Array,
    *,
    mu: float = 1.0,
    num_iters: int = 2,
    kernel: str = "clamped",
    order: str = "rows_first",
    relative_mu: bool = True,
    clamp_epsilon: float = 1e-6,
    row_marginal: jax.Array | None = None,
    col_marginal: jax.Array | None = None,
    row_segments: jax.Array | None = None,
    col_segments: jax.Array | None = None,
    domain: str = "log",
) -> SinkhornResult:
  """Soft alignment of the rows and columns of a masked similarity matrix.

  Defaults are the paper's (Eq. 1, 5, 6 and Table 11): `K = max(eps, S)`,
  `mu = 1`, two row-then-column iterations, all-ones marginals.

  Args:
    similarity: [..., n, m] similarities (any float dtype; computed in f32).
    mask: [..., n, m] bool, True on real token pairs.
    mu: regularisation: `K = max(eps, S)^(1/mu)` ("clamped") or
      `K = exp(S / T)` ("entropic", `T = mu * mean |S|` or `mu`).
    num_iters: number of (row, column) iteration pairs, static, >= 1.
    kernel: "clamped" (the paper's Eq. 1 + 5, default) or "entropic".
    order: "rows_first" (Eq. 6, default) or "columns_first" (the released
      code's `_sinkhorn_iter`).
    relative_mu: "entropic" only: scale `mu` by the mean |S| over each
      problem's valid entries (ott-jax's relative epsilon), so that the
      kernel does not saturate on raw dot products.
    clamp_epsilon: floor `eps` of `max(eps, S)` for "clamped".
    row_marginal: optional [..., n] `a`. Default: ones on real rows
      ("clamped", Eq. 6) or uniform over each problem's real rows
      ("entropic"). Mass on rows without a valid entry in a column with
      mass is dropped.
    col_marginal: optional [..., m] `b`; default likewise.
    row_segments: optional [..., n] int problem id of each row (packed
      problems on the block diagonal; the mask must be False off the
      blocks). Used for the default "entropic" marginals and `relative_mu`.
    col_segments: optional [..., m] int problem id of each column; give both
      or neither.
    domain: "log" (default: a log-sum-exp per half-step, any range),
      "scaling" (one `exp` of the kernel, then matrix-vector products; only
      for kernels whose valid entries span well under ~80 nats, e.g. the
      clamped kernel of dot products at `mu = 1`) or "auto": scaling when
      every problem's valid log-kernel spans <= 80 nats and no row/column
      sum with mass fell below 1e-25, else the log domain for the whole
      batch (`lax.cond`; under `vmap` both run, so batch with leading axes).
      Its `log_plan` is `log K + f + g`, exact to float32 rounding of
      `log K`.

  Returns:
    SinkhornResult, [..., n, m] float32 arrays. For "rows_first" the columns
    of `plan` sum to `b` exactly (the last step is a column step); for
    "columns_first" the rows sum to `a`.

  Raises:
    ValueError: unknown kernel, order or domain, `num_iters < 1`, `mu <= 0`,
      `clamp_epsilon <= 0`, or only one of the segment arguments.
  """
  if kernel not in KERNELS:
    raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
  if order not in ORDERS:
    raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
  if domain not in DOMAINS:
    raise ValueError(f"domain must be one of {DOMAINS}, got {domain!r}")
  if num_iters < 1:
    raise ValueError(f"num_iters must be >= 1, got {num_iters}")
  if not mu > 0 or not clamp_epsilon > 0:
    raise ValueError(f"mu and clamp_epsilon must be > 0, got {mu} and {clamp_epsilon}")
  if (row_segments is None) != (col_segments is None):
    raise ValueError("give both row_segments and col_segments, or neither")
  similarity = jnp.asarray(similarity).astype(jnp.float32)
  mask = jnp.broadcast_to(jnp.asarray(mask, dtype=bool), similarity.shape)
  if kernel == "entropic":
    a, b = uniform_marginals(mask, row_segments=row_segments, col_segments=col_segments)
  else:
    a = jnp.any(mask, axis=-1).astype(jnp.float32)
    b = jnp.any(mask, axis=-2).astype(jnp.float32)
  if row_marginal is not None or col_marginal is not None:
    if row_marginal is not None:
      a = jnp.asarray(row_marginal, jnp.float32)
    if col_marginal is not None:
      b = jnp.asarray(col_marginal, jnp.float32)
    mask, a, b = _drop_unreachable_mass(mask, a, b)
  log_k = log_kernel(similarity, mask, kernel=kernel, mu=mu, relative_mu=relative_mu,
                     clamp_epsilon=clamp_epsilon, row_segments=row_segments)
  return _solve(log_k, mask, _safe_log(a), _safe_log(b), num_iters=num_iters,
                rows_first=order == "rows_first", domain=domain)
