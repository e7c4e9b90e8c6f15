"""Blockwise CSLS top-10: ours vs faiss-cpu (exact IndexFlatIP) and a blockwise NumPy reference.

The workload is BLI's induction step between two vocabularies of `--n`
vectors of width `--dim`: CSLS(x, y) = 2 cos(x, y) - r_K(x) - r_K(y) (K =
`--knn`, r_K the mean of the K highest cosines in the other set, MUSE's
`csls_knn_10`), and the `--k` best targets of every source. Synthetic data
with a planted dictionary: targets are Gaussian with a shared offset (word
vectors are anisotropic), sources are a permutation of the targets plus
noise, so `planted_hit@1` (the share of sources whose CSLS top-1 is their
planted translation) says the three compute a useful CSLS, not just the same one.

* ours: `flax_xalign.ops.csls_topk` (jitted; compiled ahead, compile time
  reported apart): two blockwise passes, one matmul each (r_K of the targets;
  then r_K of the sources and the CSLS top-k from the same cosine block).
* faiss: the usual recipe with `IndexFlatIP` (exact): two kNN searches for
  r_K(x) and r_K(y), then one search with augmented vectors x' = [2x, -1],
  y' = [y, r_K(y)] (x'.y' = 2 cos - r_K(y)), minus r_K(x). Three matmuls.
* numpy: the same three passes written out in NumPy, `--block` rows at a
  time (argpartition for the top-k), float32 BLAS; `dense_gib` is what the
  full [n, n] float32 matrix of the textbook version would take.

Each method runs in a fresh subprocess (`--repeats` times, interleaved) that
loads the vectors from .npy files, times its computation from the loaded
arrays to the top-k (normalisation included; `cpu_s`: the process's user +
system CPU seconds over the same span, less sensitive than wall time to
other jobs on a shared machine) and reports its peak resident memory
(`ru_maxrss`: interpreter, libraries and data included). Ours runs with
`--block 512` by default: at 50k its cosine blocks then stay under 0.5 GB
(three [block, n] float32 buffers per block step). The top-k
indices of the three are compared (`agree_rows`: share of sources with the
same ordered top-k, `agree_entries`: mean share of the k indices in common;
float32 rounding only matters at near-ties). Threads: every library's
default on all cores. The last line is one JSON object (`ratio` = ours time /
faiss time at the first size), also written to bench/results/csls.json.

  python bench/csls.py                      # 50k x 50k, then 100k x 100k (NumPy only up to 50k)
  python bench/csls.py --n 50000 --repeats 3
  python bench/csls.py --quick              # 2000 x 2000 x 32, seconds
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
_RESULTS = os.path.join(_HERE, "results", "csls.json")
METHODS = ("ours", "faiss", "numpy")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--n", type=int, nargs="+",
                      help="vectors per side, one run per size (the first gives `ratio`); default 50000 100000")
  parser.add_argument("--dim", type=int, help="vector width; default 300")
  parser.add_argument("--k", type=int, default=10, help="CSLS neighbours per source")
  parser.add_argument("--knn", type=int, default=10, help="K of r_K")
  parser.add_argument("--block", type=int, help="query rows per block (ours and numpy); default 512")
  parser.add_argument("--numpy_max_n", type=int, default=50_000, help="skip the NumPy reference above this")
  parser.add_argument("--repeats", type=int, default=1)
  parser.add_argument("--noise", type=float, default=2.5, help="noise scale of the planted translations")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--quick", action="store_true",
                      help="defaults for a smoke run: --n 2000 --dim 32 --block 256")
  parser.add_argument("--output", default=_RESULTS)
  parser.add_argument("--worker", choices=METHODS, help=argparse.SUPPRESS)
  parser.add_argument("--data", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  quick = args.quick
  args.n = args.n or ([2000] if quick else [50_000, 100_000])
  args.dim = args.dim or (32 if quick else 300)
  args.block = args.block or (256 if quick else 512)
  if min(args.n) <= args.k or args.repeats < 1:
    parser.error("need --n > --k and --repeats >= 1")
  return args


# ----- workers: one method in a fresh process -----

def _rss_mib() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _cpu_s() -> float:
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return usage.ru_utime + usage.ru_stime


def _unit(x: np.ndarray) -> np.ndarray:
  return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-6)


def _ours(x: np.ndarray, y: np.ndarray, args: argparse.Namespace) -> tuple[np.ndarray, dict[str, float]]:
  import jax

  from flax_xalign import ops

  fn = jax.jit(lambda a, b: ops.csls_topk(a, b, k=args.k, knn=args.knn, block=args.block))
  start = time.perf_counter()
  xd, yd = jax.device_put(x), jax.device_put(y)
  compiled = fn.lower(xd, yd).compile()
  compile_s = time.perf_counter() - start
  start, cpu = time.perf_counter(), _cpu_s()
  top = jax.block_until_ready(compiled(xd, yd))
  return np.asarray(top.indices), {"seconds": time.perf_counter() - start, "cpu_s": _cpu_s() - cpu,
                                   "compile_s": compile_s}


def _faiss(x: np.ndarray, y: np.ndarray, args: argparse.Namespace) -> tuple[np.ndarray, dict[str, float]]:
  import faiss

  start = time.perf_counter()
  xu, yu = _unit(x).astype(np.float32), _unit(y).astype(np.float32)

  def search(base: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    index = faiss.IndexFlatIP(base.shape[1])
    index.add(base)
    return index.search(queries, k)

  r_x = search(yu, xu, args.knn)[0].mean(axis=1)
  r_y = search(xu, yu, args.knn)[0].mean(axis=1)
  ones = np.ones((len(xu), 1), np.float32)
  scores, indices = search(np.hstack([yu, r_y[:, None]]), np.hstack([2 * xu, -ones]), args.k)
  values = scores - r_x[:, None]  # the CSLS values, as ours returns them
  del values
  return indices, {"seconds": time.perf_counter() - start, "version": faiss.__version__}


def _numpy_topk(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
  """Row-wise top-k, descending, lower index first on ties."""
  part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
  values = np.take_along_axis(scores, part, axis=1)
  order = np.lexsort((part, -values), axis=1)
  return np.take_along_axis(values, order, axis=1), np.take_along_axis(part, order, axis=1)


def _numpy(x: np.ndarray, y: np.ndarray, args: argparse.Namespace) -> tuple[np.ndarray, dict[str, float]]:
  start = time.perf_counter()
  xu, yu = _unit(x).astype(np.float32), _unit(y).astype(np.float32)
  blocks = lambda a: range(0, len(a), args.block)

  def radius(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.concatenate([_numpy_topk(a[i:i + args.block] @ b.T, args.knn)[0].mean(axis=1) for i in blocks(a)])

  r_x, r_y = radius(xu, yu), radius(yu, xu)
  tops = [_numpy_topk(2 * (xu[i:i + args.block] @ yu.T) - r_y, args.k) for i in blocks(xu)]
  indices = np.concatenate([top[1] for top in tops])
  values = np.concatenate([top[0] for top in tops]) - r_x[:, None]  # the CSLS values
  del values
  return indices, {"seconds": time.perf_counter() - start}


def worker(args: argparse.Namespace) -> None:
  x, y = np.load(os.path.join(args.data, "x.npy")), np.load(os.path.join(args.data, "y.npy"))
  loaded_mib, cpu_before = _rss_mib(), _cpu_s()
  indices, info = {"ours": _ours, "faiss": _faiss, "numpy": _numpy}[args.worker](x, y, args)
  info.setdefault("cpu_s", _cpu_s() - cpu_before)  # ours measures its own, without compilation
  np.save(os.path.join(args.data, f"{args.worker}.npy"), indices.astype(np.int32))
  print(json.dumps({**info, "peak_mib": _rss_mib(), "loaded_mib": loaded_mib}), flush=True)


# ----- the driver -----

def make_data(n: int, dim: int, noise: float, seed: int, directory: str) -> np.ndarray:
  """Writes x.npy [n, dim] and y.npy [n, dim] (float32); returns the planted translation of each source."""
  rng = np.random.default_rng(seed)
  y = rng.standard_normal((n, dim), dtype=np.float32)
  y += 0.5 * rng.standard_normal(dim, dtype=np.float32)  # a shared offset
  planted = rng.permutation(n)
  x = y[planted] + noise * rng.standard_normal((n, dim), dtype=np.float32)
  np.save(os.path.join(directory, "x.npy"), x)
  np.save(os.path.join(directory, "y.npy"), y)
  return planted


def run_worker(method: str, directory: str, args: argparse.Namespace) -> dict[str, Any]:
  command = [sys.executable, os.path.abspath(__file__), "--worker", method, "--data", directory,
             "--k", str(args.k), "--knn", str(args.knn), "--block", str(args.block)]
  load = os.getloadavg()[0]
  proc = subprocess.run(command, capture_output=True, text=True, check=False,
                        cwd=os.path.dirname(_HERE), env={**os.environ, "PYTHONPATH": os.path.dirname(_HERE)})
  if proc.returncode != 0:
    raise RuntimeError(f"{method} worker failed:\n{proc.stderr[-4000:]}")
  return {**json.loads(proc.stdout.strip().splitlines()[-1]), "loadavg_1m": load}


def _have_faiss() -> bool:
  try:
    import faiss  # noqa: F401
  except ImportError:
    return False
  return True


def agreement(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
  same_rows = float(np.mean(np.all(a == b, axis=1)))
  common = np.mean([len(np.intersect1d(u, v)) / a.shape[1] for u, v in zip(a, b)])
  return {"agree_rows": same_rows, "agree_entries": float(common)}


def run_size(n: int, args: argparse.Namespace) -> dict[str, Any]:
  methods = [m for m in METHODS if (m != "faiss" or _have_faiss()) and (m != "numpy" or n <= args.numpy_max_n)]
  with tempfile.TemporaryDirectory(prefix="csls_bench_") as directory:
    planted = make_data(n, args.dim, args.noise, args.seed, directory)
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    for _ in range(args.repeats):
      for method in methods:
        runs[method].append(run_worker(method, directory, args))
    indices = {m: np.load(os.path.join(directory, f"{m}.npy")) for m in methods}
  result: dict[str, Any] = {"n": n, "dim": args.dim, "dense_gib": n * n * 4 / 2**30, "methods": methods}
  for method, rs in runs.items():
    result[f"{method}_s"] = statistics.median(r["seconds"] for r in rs)
    result[f"{method}_cpu_s"] = statistics.median(r["cpu_s"] for r in rs)
    result[f"{method}_peak_mib"] = max(r["peak_mib"] for r in rs)
    result[f"{method}_loaded_mib"] = max(r["loaded_mib"] for r in rs)
    result[f"{method}_runs"] = rs
  result["ours_compile_s"] = statistics.median(r["compile_s"] for r in runs["ours"])
  result["ratio"] = result["ours_s"] / result["faiss_s"] if "faiss" in methods else None
  result["ratio_cpu"] = result["ours_cpu_s"] / result["faiss_cpu_s"] if "faiss" in methods else None
  result["ratio_numpy"] = result["ours_s"] / result["numpy_s"] if "numpy" in methods else None
  result["agreement"] = {f"ours_vs_{m}": agreement(indices["ours"], indices[m]) for m in methods if m != "ours"}
  if {"faiss", "numpy"} <= set(methods):
    result["agreement"]["faiss_vs_numpy"] = agreement(indices["faiss"], indices["numpy"])
  result["planted_hit@1"] = {m: float(np.mean(indices[m][:, 0] == planted)) for m in methods}
  return result


def print_table(result: dict[str, Any]) -> None:
  print(f"CSLS top-{result['k']} (K={result['knn']}), float32, {result['cpu_count']} cores, "
        f"median of {result['repeats']} fresh-process run(s); ours: block {result['block']}")
  print(f"{'n x n x dim':<20s} {'method':<7s} {'seconds':>9s} {'vs faiss':>9s} {'cpu s':>8s} {'vs faiss':>9s} "
        f"{'peak MiB':>9s} {'load MiB':>9s} {'agree rows/entries vs ours':>27s} {'hit@1':>6s}")
  for size in result["sizes"]:
    shape = f"{size['n']} x {size['n']} x {size['dim']}"
    for method in size["methods"]:
      vs = f"{size[f'{method}_s'] / size['faiss_s']:8.2f}x" if size.get("faiss_s") else f"{'':9s}"
      cpu = size[f"{method}_cpu_s"]
      vs_cpu = f"{cpu / size['faiss_cpu_s']:8.2f}x" if size.get("faiss_cpu_s") else f"{'':9s}"
      agree = size["agreement"].get(f"ours_vs_{method}")
      agree = f"{100 * agree['agree_rows']:12.3f}% /{100 * agree['agree_entries']:8.3f}%" if agree else ""
      print(f"{shape:<20s} {method:<7s} {size[f'{method}_s']:9.2f} {vs} {cpu:8.1f} {vs_cpu} "
            f"{size[f'{method}_peak_mib']:9.0f} "
            f"{size[f'{method}_loaded_mib']:9.0f} {agree:>27s} {100 * size['planted_hit@1'][method]:5.1f}%")
    print(f"{'':20s} dense [n, n] float32 matrix: {size['dense_gib']:.1f} GiB; ours compile "
          f"{size['ours_compile_s']:.1f} s (not in its time)")


def main(argv: list[str] | None = None) -> None:
  args = parse_args(argv)
  if args.worker:
    worker(args)
    return
  sizes = [run_size(n, args) for n in args.n]
  result = {
      "benchmark": "csls", "ratio": sizes[0]["ratio"], "ratio_cpu": sizes[0]["ratio_cpu"],
      "ours_peak_mib": sizes[0]["ours_peak_mib"],
      "dense_gib": sizes[0]["dense_gib"], "sizes": sizes, "k": args.k, "knn": args.knn, "block": args.block,
      "dim": args.dim, "repeats": args.repeats, "cpu_count": os.cpu_count(), "faiss_available": _have_faiss(),
  }
  print_table(result)
  os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
  from flax_xalign import fileio

  fileio.write_atomically(args.output, json.dumps(result, indent=2))
  print(json.dumps(result), flush=True)


if __name__ == "__main__":
  main()
