"""XLM-Align's Sinkhorn step: ours vs POT, ott-jax and a measured roofline.

The workload is DWA's self-labelling input: `--batch` sentence pairs with
seeded random lengths in [`--min_len`, `--length`] per side, padded to one
`[batch, length, length]` array with a mask (32 x 128 x 128 by default), and
similarities = raw dot products of synthetic hidden states (a shared offset,
a "meaning" per aligned token, noise; |S| ~ 100, as hidden states' dot
products are). Every peer computes the paper's default (Eq. 1, 5, 6): kernel
`K = max(eps, S)^(1/mu)`, all-ones marginals, exactly `--iters` iterations,
`v = 1` first, then `u = 1 / Kv`, `v = 1 / K^T u` (no convergence test):

* ours: `flax_xalign.ops.sinkhorn` with its defaults (`domain="log"`, as
  `AlignmentSolver` runs it), one jitted call on the padded batch;
  `ours_auto` is `domain="auto"` (one `exp`, then matrix-vector products,
  with a checked fallback).
* POT: `ot.sinkhorn(1_n, 1_m, -log max(eps, S), mu, method="sinkhorn",
  numItermax=N, stopThr=0)` in a Python loop over the unpadded pairs (numpy,
  float64), as POT is used.
* ott-jax: `Sinkhorn(lse_mode=True, min_iterations=N, max_iterations=N,
  inner_iterations=1)` on `Geometry(cost_matrix=-log max(eps, S), epsilon=mu)`
  (absolute epsilon), jitted and vmapped over the padded batch, marginals 0
  on padding. Reported as unavailable if `ott` is not installed.

POT and ott update the column scaling first; N of their iterations on `S^T`
are N of ours on `S` (transpose them back), so they get `S^T`. An agreement
check (before timing, on `--check_pairs` pairs) asserts that the plans match.

Roofline: one fused elementwise pass over the same `[batch, length, length]`
float32 array, `jnp.sum(jnp.exp(x), axis=-1)` jitted, is timed in the same
run; the algorithm needs at least `2 * iters + 1` such passes: each half-step
(u or v) must read every kernel entry once (a log-sum-exp row or column
reduction), and the plan is written once at the end. `roofline_ms` = passes
x the pass time; `ours / roofline` says how far ours is from it.

Inputs are prepared outside the timing for every peer. Timing: after a
warm-up call, `--repeats` rounds, each timing every peer once in turn (so
load changes on a shared machine hit all of them); medians are reported.
The last printed line is one JSON object (`ratio` = POT time / ours: how
many times faster ours is), also written to bench/results/sinkhorn.json.

  python bench/sinkhorn.py                       # 32 x 128 x 128, 2 iterations
  python bench/sinkhorn.py --batch 4 --length 16 --repeats 1   # smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

_RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "sinkhorn.json")
EPS = 1e-6  # the paper's / ops.sinkhorn's clamp_epsilon


def _import_pot() -> Any:
  """POT with its numpy backend only: it imports every array library it finds
  to register backends (~10 s with TensorFlow installed)."""
  os.environ.setdefault("POT_BACKEND_DISABLE_TENSORFLOW", "1")
  os.environ.setdefault("POT_BACKEND_DISABLE_PYTORCH", "1")
  import ot

  return ot


def _ott_version() -> str | None:
  try:
    import ott
  except ImportError:
    return None
  return ott.__version__


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--batch", type=int, default=32, help="pairs per padded batch")
  parser.add_argument("--length", type=int, default=128, help="padded side length")
  parser.add_argument("--min_len", type=int, default=16)
  parser.add_argument("--dim", type=int, default=64, help="hidden size of the synthetic states")
  parser.add_argument("--iters", type=int, default=2)
  parser.add_argument("--mu", type=float, default=1.0)
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--check_pairs", type=int, default=8)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--output", default=_RESULTS)
  args = parser.parse_args(argv)
  if not 1 <= args.min_len <= args.length:
    parser.error("need 1 <= --min_len <= --length")
  return args


def make_problems(args: argparse.Namespace) -> dict[str, Any]:
  """Dot products of synthetic hidden states of ragged pairs, padded to `length`."""
  rng = np.random.default_rng(args.seed)
  size, count = args.length, args.batch
  rows = rng.integers(args.min_len, size + 1, size=count)
  cols = rng.integers(args.min_len, size + 1, size=count)
  sims = np.zeros((count, size, size), np.float32)
  offset = rng.normal(size=args.dim)  # hidden states share a large common direction
  for k, (n, m) in enumerate(zip(rows, cols)):
    meaning = rng.normal(size=(max(n, m), args.dim))
    src = offset + meaning[rng.permutation(max(n, m))[:n]] + 0.8 * rng.normal(size=(n, args.dim))
    tgt = offset + meaning[rng.permutation(max(n, m))[:m]] + 0.8 * rng.normal(size=(m, args.dim))
    sims[k, :n, :m] = src @ tgt.T
  index = np.arange(size)
  mask = (index[None, :, None] < rows[:, None, None]) & (index[None, None, :] < cols[:, None, None])
  return {"sims": sims, "mask": mask, "rows": rows, "cols": cols}


def ours_solver(mu: float, iters: int, domain: str = "log") -> Callable[..., jax.Array]:
  from flax_xalign.ops import sinkhorn

  return jax.jit(lambda sims, mask: sinkhorn(sims, mask, mu=mu, num_iters=iters, domain=domain).plan)


def ott_solver(mu: float, iters: int) -> Callable[..., jax.Array]:
  """ott on S^T (it updates columns first), transposed back: ours' orientation."""
  from ott.geometry import geometry
  from ott.problems.linear import linear_problem
  from ott.solvers.linear import sinkhorn as ott_sinkhorn

  solver = ott_sinkhorn.Sinkhorn(lse_mode=True, threshold=-1.0, min_iterations=iters,
                                 max_iterations=iters, inner_iterations=1)

  def one(sims_t, mask_t):
    a = jnp.any(mask_t, axis=1).astype(jnp.float32)
    b = jnp.any(mask_t, axis=0).astype(jnp.float32)
    cost = jnp.where(mask_t, -jnp.log(jnp.maximum(sims_t, EPS)), 0.0)
    geom = geometry.Geometry(cost_matrix=cost, epsilon=mu)
    return solver(linear_problem.LinearProblem(geom, a=a, b=b)).matrix.T

  return jax.jit(jax.vmap(one))


def pot_inputs(problems: dict[str, Any]) -> list[tuple[np.ndarray, ...]]:
  """(ones, ones, cost of S^T) per unpadded pair, float64."""
  out = []
  for sim, n, m in zip(problems["sims"], problems["rows"], problems["cols"]):
    cost = -np.log(np.maximum(sim[:n, :m].T.astype(np.float64), EPS))
    out.append((np.ones(m), np.ones(n), cost))
  return out


def pot_solver(mu: float, iters: int) -> Callable[..., list[np.ndarray]]:
  ot = _import_pot()

  def run(inputs):
    return [ot.sinkhorn(a, b, cost, mu, method="sinkhorn", numItermax=iters, stopThr=0.0, warn=False).T
            for a, b, cost in inputs]

  return run


def roofline_pass() -> Callable[[jax.Array], jax.Array]:
  """One fused elementwise pass with a row reduction, the shape of a half-step."""
  return jax.jit(lambda x: jnp.sum(jnp.exp(x), axis=-1))


def check_agreement(problems, outputs: dict[str, Any], count: int) -> dict[str, float]:
  """Asserts that every peer's plan matches POT's on the first `count` pairs; max |diff| per peer."""
  expected = outputs["pot"][:count]
  diffs = {}
  for name, plans in outputs.items():
    if name == "pot":
      continue
    diffs[name] = 0.0
    for k, ref in enumerate(expected):
      n, m = problems["rows"][k], problems["cols"][k]
      plan = np.asarray(plans[k])[:n, :m]
      np.testing.assert_allclose(plan, ref, rtol=1e-3, atol=1e-6, err_msg=f"{name} vs POT, pair {k}")
      diffs[name] = max(diffs[name], float(np.max(np.abs(plan - ref))))
  return diffs


def _timed(fn: Callable[[], Any]) -> float:
  start = time.perf_counter()
  jax.block_until_ready(fn())
  return (time.perf_counter() - start) * 1e3


def run(args: argparse.Namespace) -> dict[str, Any]:
  load_before = os.getloadavg()[0]
  problems = make_problems(args)
  sims, mask = jnp.asarray(problems["sims"]), jnp.asarray(problems["mask"])
  inputs = pot_inputs(problems)
  ours, ours_auto, pot = ours_solver(args.mu, args.iters), ours_solver(args.mu, args.iters, "auto"), \
      pot_solver(args.mu, args.iters)
  peers: dict[str, Callable[[], Any]] = {
      "ours": lambda: ours(sims, mask),
      "ours_auto": lambda: ours_auto(sims, mask),
      "pot": lambda: pot(inputs),
  }
  ott_version = _ott_version()
  if ott_version is not None:
    ott = ott_solver(args.mu, args.iters)
    sims_t, mask_t = jnp.swapaxes(sims, 1, 2), jnp.swapaxes(mask, 1, 2)
    peers["ott"] = lambda: ott(sims_t, mask_t)
  one_pass = roofline_pass()
  peers["one_pass"] = lambda: one_pass(sims)

  count = min(args.check_pairs, args.batch)
  check = {name: fn() for name, fn in peers.items() if name != "one_pass"}  # also the warm-up
  diffs = check_agreement(problems, check, count)
  jax.block_until_ready(peers["one_pass"]())
  times: dict[str, list[float]] = {name: [] for name in peers}
  for _ in range(args.repeats):
    for name, fn in peers.items():
      times[name].append(_timed(fn))
  ms = {name: statistics.median(t) for name, t in times.items()}
  passes = 2 * args.iters + 1
  roofline_ms = passes * ms["one_pass"]
  real = float(np.sum(problems["rows"] * problems["cols"]))
  result: dict[str, Any] = {
      "benchmark": "sinkhorn",
      "ratio": ms["pot"] / ms["ours"],
      "ratio_ott": ms["ott"] / ms["ours"] if "ott" in ms else None,
      "ours_over_roofline": ms["ours"] / roofline_ms,
      "ours_auto_over_roofline": ms["ours_auto"] / roofline_ms,
      "roofline_ms": roofline_ms, "roofline_passes": passes, "one_pass_ms": ms["one_pass"],
      **{f"{name}_ms": t for name, t in ms.items()},
      "ms_rounds": {name: [round(t, 3) for t in ts] for name, ts in times.items()},
      "max_abs_diff_vs_pot": diffs,
      "kernel": "clamped max(eps, S)^(1/mu), rows first, all-ones marginals",
      "num_iters": args.iters, "mu": args.mu, "shape": list(problems["sims"].shape),
      "lengths": [args.min_len, args.length], "dim": args.dim,
      "mean_abs_similarity": float(np.abs(problems["sims"][problems["mask"]]).mean()),
      "real_fraction": real / problems["mask"].size, "repeats": args.repeats,
      "devices": [str(d) for d in jax.devices()], "cpu_count": os.cpu_count(),
      "loadavg_1m": [load_before, os.getloadavg()[0]],
      "versions": {"jax": jax.__version__, "pot": _import_pot().__version__,
                   "ott-jax": ott_version or "unavailable", "numpy": np.__version__},
  }
  return result


def print_table(result: dict[str, Any]) -> None:
  shape = " x ".join(map(str, result["shape"]))
  print(f"Sinkhorn (paper kernel, {result['num_iters']} iterations, mu={result['mu']}) on {shape} padded "
        f"dot products ({100 * result['real_fraction']:.0f}% real, mean |S| "
        f"{result['mean_abs_similarity']:.0f}), median of {result['repeats']} interleaved rounds on "
        f"{result['devices'][0]}; load {result['loadavg_1m'][0]:.1f} -> {result['loadavg_1m'][1]:.1f}")
  rows = [("ours (log domain)", "ours"), ("ours (auto domain)", "ours_auto"), ("POT (loop, float64)", "pot"),
          ("ott-jax (vmap)", "ott"),
          (f"roofline ({result['roofline_passes']} passes)", "roofline"), ("  one pass", "one_pass")]
  print(f"{'peer':<24s} {'ms/batch':>10s} {'vs ours':>9s} {'max|diff| vs POT':>17s}")
  for label, name in rows:
    if name == "ott" and result["ratio_ott"] is None:
      print(f"{label:<24s} {'unavailable (ott-jax not installed)':>38s}")
      continue
    ms = result[f"{name}_ms"]
    diff = result["max_abs_diff_vs_pot"].get(name)
    diff = f"{diff:17.1e}" if diff is not None else ""
    print(f"{label:<24s} {ms:10.3f} {ms / result['ours_ms']:8.2f}x {diff}")
  ott = f", ott-jax {result['ratio_ott']:.2f}x" if result["ratio_ott"] is not None else ", ott-jax unavailable"
  print(f"ours is faster than: POT {result['ratio']:.2f}x{ott}; ours takes "
        f"{result['ours_over_roofline']:.2f}x the roofline (auto domain {result['ours_auto_over_roofline']:.2f}x)")


def main(argv: list[str] | None = None) -> None:
  args = parse_args(argv)
  result = run(args)
  print_table(result)
  os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
  from flax_xalign import fileio

  fileio.write_atomically(args.output, json.dumps(result, indent=2))
  print(json.dumps(result), flush=True)


if __name__ == "__main__":
  main()
