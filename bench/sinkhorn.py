"""Masked batched Sinkhorn: ours vs POT and ott-jax on ragged sentence pairs.

The workload is XLM-Align's self-labelling step: `--pairs` sentence pairs with
seeded random lengths in [`--min_len`, `--max_len`] on each side, similarities
= cosines of synthetic hidden states (a shared "meaning" per aligned token plus
noise, so the plans have structure), entropic kernel `exp(S / mu)`, uniform
marginals, exactly `--iters` iterations for every peer (no convergence test).
Cosines in [-1, 1] with `mu = 0.1` keep POT's scaling-domain `ot.sinkhorn`
(plain `exp(-M / reg)`) finite; raw dot products of hidden states overflow it.

* ours: `flax_xalign.ops.sinkhorn(..., domain=--domain)` (default "auto":
  scaling domain with a checked fallback to the log domain) on length
  buckets: pairs are grouped by their shape rounded up to `--bucket`
  (default 32: 16 groups, 67% real entries instead of 30%), and each group,
  padded and masked, is one jitted call, as a length-bucketing caller does.
  `ours_log_padded` is the previous configuration: one log-domain call on the
  batch padded to `max_len x max_len`.
* POT: `ot.sinkhorn(a, b, -S, mu, method="sinkhorn", numItermax=N,
  stopThr=0)` in a Python loop over the unpadded pairs (numpy, float64), as
  POT is used; its TensorFlow/PyTorch backends are disabled (import time only).
* ott-jax: `Sinkhorn(min_iterations=N, max_iterations=N, inner_iterations=1)`
  in log domain, jitted and vmapped: cost `-S` (0 on padding) and marginals
  that are 0 on padding rows and columns. `ott` gets the same buckets as ours,
  `ott_padded` the single padded batch.

POT and ott update the column scaling first; we follow the paper and update the
rows first. N iterations of theirs on `S` are N iterations of ours on `S^T`
(transposed), so the agreement check (run before timing, on `--check_pairs`
pairs and asserted) compares against ours on the transposed problems. The
timed runs give every peer `S` in its own orientation: the work is the same.

Inputs are prepared outside the timing for every peer (POT's float64 costs
and marginals; the device buckets for ours and ott, which the aligner's
encoder produces on device); `pack` times building the buckets from a list
of host arrays, for a caller that starts there. Timing: after a warm-up
call, `--repeats` rounds, each timing every peer once in turn (so load
changes on a shared machine hit all of them); medians are reported, with the
process CPU time per wall second. The last printed line is one JSON object,
also written to bench/results/sinkhorn.json.

  python bench/sinkhorn.py                      # 256 pairs, iters 2 and 20
  python bench/sinkhorn.py --iters 2 --pairs 64 --repeats 3
  python bench/sinkhorn.py --domain log --bucket 0   # the old configuration
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

_RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                        "sinkhorn.json")


def _import_pot() -> Any:
  """POT with its numpy backend only: it imports every array library it finds
  to register backends (~10 s with TensorFlow installed)."""
  os.environ.setdefault("POT_BACKEND_DISABLE_TENSORFLOW", "1")
  os.environ.setdefault("POT_BACKEND_DISABLE_PYTORCH", "1")
  import ot

  return ot


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--pairs", type=int, default=256)
  parser.add_argument("--max_len", type=int, default=128)
  parser.add_argument("--min_len", type=int, default=8)
  parser.add_argument("--dim", type=int, default=64, help="hidden size")
  parser.add_argument("--iters", type=int, nargs="+", default=[2, 20],
                      help="iteration counts; the first is the headline")
  parser.add_argument("--mu", type=float, default=0.1)
  parser.add_argument("--domain", default="auto", choices=("log", "scaling", "auto"),
                      help="ours' domain (ours_log_padded is always log)")
  parser.add_argument("--bucket", type=int, default=32,
                      help="round pair shapes up to this multiple; 0: one padded batch")
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--check_pairs", type=int, default=8)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--output", default=_RESULTS)
  args = parser.parse_args(argv)
  if not 1 <= args.min_len <= args.max_len:
    parser.error("need 1 <= --min_len <= --max_len")
  return args


def make_problems(args: argparse.Namespace) -> dict[str, Any]:
  """Cosine similarities of ragged synthetic pairs, padded to max_len."""
  rng = np.random.default_rng(args.seed)
  size, count = args.max_len, args.pairs
  rows = rng.integers(args.min_len, args.max_len + 1, size=count)
  cols = rng.integers(args.min_len, args.max_len + 1, size=count)
  sims = np.zeros((count, size, size), np.float32)
  for k, (n, m) in enumerate(zip(rows, cols)):
    meaning = rng.normal(size=(max(n, m), args.dim))
    src = meaning[rng.permutation(max(n, m))[:n]] + 0.8 * rng.normal(size=(n, args.dim))
    tgt = meaning[rng.permutation(max(n, m))[:m]] + 0.8 * rng.normal(size=(m, args.dim))
    src /= np.linalg.norm(src, axis=1, keepdims=True)
    tgt /= np.linalg.norm(tgt, axis=1, keepdims=True)
    sims[k, :n, :m] = src @ tgt.T
  index = np.arange(size)
  mask = (index[None, :, None] < rows[:, None, None]) & (index[None, None, :] < cols[:, None, None])
  return {"sims": sims, "mask": mask, "rows": rows, "cols": cols}


def ours_solver(mu: float, iters: int, domain: str = "log") -> Callable[..., jax.Array]:
  from flax_xalign.ops import sinkhorn

  return jax.jit(lambda sims, mask: sinkhorn(sims, mask, mu=mu, num_iters=iters,
                                             domain=domain).plan)


def unpadded_pairs(problems: dict[str, Any], transpose: bool = False) -> list[np.ndarray]:
  pairs = [sim[:n, :m] for sim, n, m in zip(problems["sims"], problems["rows"], problems["cols"])]
  return [np.ascontiguousarray(p.T) for p in pairs] if transpose else pairs


def _round_up(x: int, multiple: int) -> int:
  return -(-x // multiple) * multiple


def bucket_groups(shapes: list[tuple[int, int]], multiple: int) -> dict[tuple[int, int], list[int]]:
  """Pair indices grouped by shape rounded up to `multiple` (0: one group at the largest)."""
  if multiple <= 0:
    size = max(max(shape) for shape in shapes)
    return {(size, size): list(range(len(shapes)))}
  groups: dict[tuple[int, int], list[int]] = {}
  for k, (n, m) in enumerate(shapes):
    groups.setdefault((_round_up(n, multiple), _round_up(m, multiple)), []).append(k)
  return groups


def pack(pairs: list[np.ndarray], multiple: int) -> list[tuple[jax.Array, jax.Array]]:
  """Pads each shape bucket of unpadded pairs into one masked device batch.

  The buckets come in the order of `bucket_groups`; `unbucket` reads the
  pairs back out of the plans.
  """
  out = []
  for (rows, cols), members in bucket_groups([p.shape for p in pairs], multiple).items():
    sims = np.zeros((len(members), rows, cols), np.float32)
    mask = np.zeros((len(members), rows, cols), bool)
    for slot, k in enumerate(members):
      n, m = pairs[k].shape
      sims[slot, :n, :m] = pairs[k]
      mask[slot, :n, :m] = True
    out.append((jnp.asarray(sims), jnp.asarray(mask)))
  return out


def bucketed(solve: Callable[..., jax.Array]) -> Callable[..., list[jax.Array]]:
  """One (jitted) call per packed bucket."""
  return lambda buckets: [solve(sims, mask) for sims, mask in buckets]


def unbucket(plans: list[jax.Array], pairs: list[np.ndarray], multiple: int) -> list[np.ndarray]:
  out: list[np.ndarray] = [np.empty(0)] * len(pairs)
  groups = bucket_groups([p.shape for p in pairs], multiple)
  for plan, members in zip(plans, groups.values()):
    plan = np.asarray(plan)
    for slot, k in enumerate(members):
      out[k] = plan[slot, :pairs[k].shape[0], :pairs[k].shape[1]]
  return out


def ott_solver(mu: float, iters: int) -> Callable[..., jax.Array]:
  from ott.geometry import geometry
  from ott.problems.linear import linear_problem
  from ott.solvers.linear import sinkhorn as ott_sinkhorn

  solver = ott_sinkhorn.Sinkhorn(
      lse_mode=True, threshold=-1.0, min_iterations=iters, max_iterations=iters,
      inner_iterations=1)

  def one(sims, mask):
    a = jnp.any(mask, axis=1).astype(jnp.float32)
    b = jnp.any(mask, axis=0).astype(jnp.float32)
    geom = geometry.Geometry(cost_matrix=jnp.where(mask, -sims, 0.0), epsilon=mu)
    problem = linear_problem.LinearProblem(geom, a=a / a.sum(), b=b / b.sum())
    return solver(problem).matrix

  return jax.jit(jax.vmap(one))


def pot_inputs(problems: dict[str, Any]) -> list[tuple[np.ndarray, ...]]:
  out = []
  for sim, n, m in zip(problems["sims"], problems["rows"], problems["cols"]):
    cost = -sim[:n, :m].astype(np.float64)
    out.append((np.full(n, 1.0 / n), np.full(m, 1.0 / m), cost))
  return out


def pot_solver(mu: float, iters: int) -> Callable[..., list[np.ndarray]]:
  ot = _import_pot()

  def run(inputs):
    return [ot.sinkhorn(a, b, cost, mu, method="sinkhorn", numItermax=iters,
                        stopThr=0.0, warn=False) for a, b, cost in inputs]

  return run


def check_agreement(problems, inputs, peers, multiple, count) -> dict[str, float]:
  """Asserts that POT, ott and ours (on S^T) give the same plans on `count` pairs.

  `peers` maps a name to (run on a list of pairs, transposed?): POT and ott
  update the columns first, so ours runs on the transposed pairs.
  """
  sub = {key: problems[key][:count] for key in ("sims", "rows", "cols")}
  expected = peers["pot"][0](inputs[:count])
  diffs = {}
  for name, (run, transpose) in peers.items():
    if name == "pot":
      continue
    pairs = unpadded_pairs(sub, transpose)
    size = 0 if name.endswith("_padded") else multiple
    plans = unbucket(run(pack(pairs, size)), pairs, size)
    diffs[name] = 0.0
    for k, (plan, ref) in enumerate(zip(plans, expected)):
      plan = plan.T if transpose else plan
      np.testing.assert_allclose(plan, ref, rtol=2e-3, atol=1e-7,
                                 err_msg=f"{name} vs POT, pair {k}")
      diffs[name] = max(diffs[name], float(np.max(np.abs(plan - ref))))
  return diffs


def _timed(fn: Callable[[], Any]) -> tuple[float, float]:
  """(wall seconds, process CPU seconds per wall second) of one call."""
  cpu, wall = time.process_time(), time.perf_counter()
  jax.block_until_ready(fn())
  wall = time.perf_counter() - wall
  return wall, (time.process_time() - cpu) / wall


def run_iters(problems, inputs, args, iters: int) -> dict[str, Any]:
  """Times every peer on the whole job; see the module docstring."""
  ours = ours_solver(args.mu, iters, args.domain)
  ott = ott_solver(args.mu, iters)
  pot = pot_solver(args.mu, iters)
  runners = {  # name: (solver, takes S^T?)
      "ours": (bucketed(ours), True),
      "ours_log_padded": (bucketed(ours_solver(args.mu, iters, "log")), True),
      "pot": (pot, False),
      "ott": (bucketed(ott), False),
      "ott_padded": (bucketed(ott), False),
  }
  diffs = check_agreement(problems, inputs, runners, args.bucket, args.check_pairs)
  # Inputs are prepared outside the timing for every peer (POT's float64
  # costs and marginals, the device buckets for ours and ott): in the aligner
  # the similarities come out of the encoder already bucketed on device.
  # "pack" times building the buckets from a list of host arrays instead.
  pairs = unpadded_pairs(problems)
  packed = {size: pack(pairs, size) for size in (args.bucket, 0)}
  peers = {name: (lambda run=run, name=name: run(
      inputs if name == "pot" else packed[0 if name.endswith("_padded") else args.bucket]))
           for name, (run, _) in runners.items()}
  peers["pack"] = lambda: pack(pairs, args.bucket)
  for fn in peers.values():
    jax.block_until_ready(fn())  # compile / warm up
  walls = {name: [] for name in peers}
  cpus = {name: [] for name in peers}
  for _ in range(args.repeats):
    for name, fn in peers.items():
      wall, cpu = _timed(fn)
      walls[name].append(wall * 1e3)
      cpus[name].append(cpu)
  out: dict[str, Any] = {"num_iters": iters, "max_abs_diff": diffs, "peers": list(peers)}
  for name in peers:
    ms = statistics.median(walls[name])
    out[f"{name}_ms"] = ms
    out[f"{name}_pairs_per_sec"] = args.pairs / ms * 1e3
    out[f"{name}_cpu_per_wall"] = statistics.median(cpus[name])
    out[f"{name}_ms_rounds"] = [round(t, 3) for t in walls[name]]
  out["ratio"] = out["pot_ms"] / out["ours_ms"]
  out["ratio_ott"] = out["ott_ms"] / out["ours_ms"]
  out["ratio_ott_padded"] = out["ott_padded_ms"] / out["ours_ms"]
  out["speedup_vs_log_padded"] = out["ours_log_padded_ms"] / out["ours_ms"]
  return out


def _versions() -> dict[str, str]:
  import ott

  ot = _import_pot()

  return {"jax": jax.__version__, "pot": ot.__version__, "ott-jax": ott.__version__,
          "numpy": np.__version__}


def run(args: argparse.Namespace) -> dict[str, Any]:
  load_before = os.getloadavg()[0]
  problems = make_problems(args)
  inputs = pot_inputs(problems)
  by_iters = [run_iters(problems, inputs, args, iters) for iters in args.iters]
  real = float(np.sum(problems["rows"] * problems["cols"]))
  groups = bucket_groups(list(zip(problems["rows"], problems["cols"])), args.bucket)
  bucketed_size = sum(len(members) * rows * cols for (rows, cols), members in groups.items())
  head = by_iters[0]
  return {
      "benchmark": "sinkhorn",
      "ratio": head["ratio"], "ratio_ott": head["ratio_ott"],
      "num_iters": head["num_iters"], "mu": args.mu,
      "ours_ms": head["ours_ms"], "pot_ms": head["pot_ms"], "ott_ms": head["ott_ms"],
      "pairs": args.pairs, "padded_shape": list(problems["sims"].shape),
      "lengths": [args.min_len, args.max_len], "dim": args.dim,
      "real_fraction_of_padded": real / problems["mask"].size,
      "domain": args.domain, "bucket": args.bucket, "buckets": len(groups),
      "real_fraction_of_buckets": real / bucketed_size,
      "repeats": args.repeats, "by_iters": by_iters, "cpu_count": os.cpu_count(),
      "loadavg_1m": [load_before, os.getloadavg()[0]],
      "versions": _versions(),
  }


def print_table(result: dict[str, Any]) -> None:
  shape = "x".join(map(str, result["padded_shape"]))
  print(f"Sinkhorn, {result['pairs']} pairs, lengths {result['lengths'][0]}-"
        f"{result['lengths'][1]} (padded {shape}, "
        f"{100 * result['real_fraction_of_padded']:.0f}% real; {result['buckets']} buckets "
        f"of multiple {result['bucket']}, {100 * result['real_fraction_of_buckets']:.0f}% real), "
        f"mu={result['mu']}, ours domain={result['domain']}, "
        f"median of {result['repeats']} interleaved rounds; load average "
        f"{result['loadavg_1m'][0]:.1f} -> {result['loadavg_1m'][1]:.1f} "
        f"on {result['cpu_count']} cores")
  print(f"{'iters':>5s} {'peer':>16s} {'ms/batch':>10s} {'pairs/s':>10s} {'cpu/wall':>9s}"
        f" {'max|diff|':>10s}")
  for row in result["by_iters"]:
    for name in row["peers"]:
      if name == "pack":
        print(f"{row['num_iters']:5d} {'(pack buckets)':>16s} {row['pack_ms']:10.2f}")
        continue
      diff = f"{row['max_abs_diff'][name]:10.1e}" if name in row["max_abs_diff"] else ""
      print(f"{row['num_iters']:5d} {name:>16s} {row[name + '_ms']:10.2f} "
            f"{row[name + '_pairs_per_sec']:10.0f} {row[name + '_cpu_per_wall']:9.2f} {diff}")
    print(f"{row['num_iters']:5d} ratio ours vs POT {row['ratio']:.2f}x, "
          f"vs ott-jax {row['ratio_ott']:.2f}x (same buckets; "
          f"{row['ratio_ott_padded']:.2f}x vs ott padded), "
          f"{row['speedup_vs_log_padded']:.2f}x the log-domain padded call")


def main(argv: list[str] | None = None) -> None:
  args = parse_args(argv)
  result = run(args)
  print_table(result)
  os.makedirs(os.path.dirname(args.output), exist_ok=True)
  from flax_xalign import fileio

  fileio.write_atomically(args.output, json.dumps(result, indent=2))
  print(json.dumps(result), flush=True)


if __name__ == "__main__":
  main()
