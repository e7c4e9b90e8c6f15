"""MLM-GC's table lookup for one batch: CSR binary search (ours) vs `jnp.searchsorted` over flat keys.

The workload is what the `gc` objective asks of the `cooc` asset in one train
step: a `--batch` x `--length` batch with `--mask_rate` of each row's
positions masked, and for every masked slot t its 2n neighbours t±1..t±n
(`--window` n; neighbours outside the row are queried with id -1 and are not
found), i.e. batch x round(length x rate) x 2n (centre, neighbour) pairs
(32 x 19 x 4 = 2,432 by default). The table is a random CSR over `--vocab`
ids with ~`--nnz` entries (25M over 32k ids by default, ~200 MB), skewed like
a real one: row a holds ~(a + 1)^-0.75 of the entries, so frequent tokens
have long rows (the first ones all V entries), and the batch's token ids are
drawn as floor(V u^2) for uniform u, so the queries hit the long rows
often; `--hit_rate` (0.9) of the in-row pairs are pairs of the table, as in
a run whose table was counted on its training corpus.

* ours: `flax_xalign.ops.cooc_lookup.lookup` (a fixed-count binary search in
  each query's row), jitted, the table passed as arguments (as the train step
  gets its assets), with its default loop (`unroll=None`: rolled on CPU,
  unrolled on accelerators); `ours[unrolled]` and `ours[rolled]` force one.
* searchsorted: the flat-key peer, `jnp.searchsorted(keys, a * V + b)` over
  the same table as one sorted int32 array of a * V + b (fits int32 only for
  V <= 46,340, hence not what the asset stores), then a compare and a gather;
  with `method` 'scan' (JAX's default), 'scan_unrolled' and 'sort' (the last
  only up to 2M entries: it sorts table and queries together on every call).

Every peer is checked against NumPy (`np.searchsorted` on int64 keys) first.
Timing: after a warm-up (compilation), `--repeats` rounds, each timing every
peer once in turn (so load changes hit all of them); one call = one batch's
lookup, `block_until_ready` included (so dispatch is included, as in a step
it is not: there the lookup is fused into the step's program). A second
measure, `per_query_ns`, times `--stack` batches in one call to show the
cost per query once dispatch is amortised. The last printed line is one JSON
object: `seconds_per_batch` (ours), `peer_seconds_per_batch` (the fastest
searchsorted), `ratio` = peer / ours (how many times faster ours is).

  python bench/cooc_lookup.py                    # V 32k, 25M entries, batch 32 x 128
  python bench/cooc_lookup.py --quick            # V 3000, 200k entries, seconds
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from flax_xalign.ops import cooc_lookup

METHODS = ("scan", "scan_unrolled", "sort")
_SORT_MAX_NNZ = 2_000_000  # 'sort' is timed only on tables up to this size (9 s per batch at 25M on CPU).


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--vocab", type=int, help="table ids V; default 32000")
  parser.add_argument("--nnz", type=int, help="table entries; default 25,000,000")
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--length", type=int, default=128)
  parser.add_argument("--mask_rate", type=float, default=0.15)
  parser.add_argument("--window", type=int, default=2, help="n: 2n neighbours per masked slot")
  parser.add_argument("--hit_rate", type=float, default=0.9, help="share of in-row pairs that are in the table")
  parser.add_argument("--repeats", type=int, default=50)
  parser.add_argument("--stack", type=int, default=64, help="batches per call of the per-query measure")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--quick", action="store_true", help="--vocab 3000 --nnz 200000 --repeats 5 --stack 4")
  parser.add_argument("--output", default="", help="also write the JSON summary to this file")
  args = parser.parse_args(argv)
  args.vocab = args.vocab or (3000 if args.quick else 32_000)
  args.nnz = args.nnz or (200_000 if args.quick else 25_000_000)
  if args.quick:
    args.repeats, args.stack = min(args.repeats, 5), min(args.stack, 4)
  if args.vocab > 46_340:
    parser.error("the flat-key peer needs V * V < 2**31, i.e. --vocab <= 46340")
  if args.nnz > args.vocab * args.vocab // 2:
    parser.error("--nnz must be at most V * V / 2 (a random table that dense takes too long to draw)")
  return args


def skewed_ids(rng: np.random.Generator, vocab: int, size: Any) -> np.ndarray:
  """Ids floor(V u^2): id i has probability ~ 1 / sqrt(i), so low ids are frequent."""
  return np.minimum((vocab * rng.random(size) ** 2).astype(np.int64), vocab - 1)


def random_table(rng: np.random.Generator, vocab: int, nnz: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(indptr int32 [V + 1], indices int32 [~nnz], log_x float32) with Zipf-like row lengths.

  Row a holds ~nnz (a + 1)^-0.75 / sum entries (at most V; frequent tokens
  have nearly full rows, as in a real table), at distinct uniform columns.
  """
  weights = (np.arange(vocab) + 1.0) ** -0.75
  low, high = 0.0, float(nnz) / weights.min()
  for _ in range(60):  # The scale whose capped row lengths add up to nnz.
    scale = (low + high) / 2
    low, high = (scale, high) if np.minimum(vocab, np.floor(scale * weights)).sum() < nnz else (low, scale)
  lengths = np.minimum(vocab, np.floor(high * weights)).astype(np.int64)
  indptr = np.zeros(vocab + 1, np.int64)
  np.cumsum(lengths, out=indptr[1:])
  indices = np.empty(int(indptr[-1]), np.int32)
  for a in np.flatnonzero(lengths):
    indices[indptr[a]:indptr[a + 1]] = np.sort(rng.choice(vocab, int(lengths[a]), replace=False))
  return indptr.astype(np.int32), indices, rng.normal(1.0, 1.5, indices.size).astype(np.float32)


def batch_queries(rng: np.random.Generator, args: argparse.Namespace, indptr: np.ndarray,
                  indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(centre, neighbour) int32 [batch, masked, 2n] of one masked batch.

  Neighbours outside the row are -1 (not found). The table of a real run is
  counted on the training corpus, so the pairs of a batch are mostly in it:
  `--hit_rate` of the others are replaced by a column of the centre's row.
  """
  tokens = skewed_ids(rng, args.vocab, (args.batch, args.length))
  masked = max(1, round(args.length * args.mask_rate))
  slots = np.stack([np.sort(rng.choice(args.length, masked, replace=False)) for _ in range(args.batch)])
  offsets = np.array([d for d in range(-args.window, args.window + 1) if d], np.int64)
  where = slots[:, :, None] + offsets
  inside = (where >= 0) & (where < args.length)
  centre = np.take_along_axis(tokens, slots, axis=1)[:, :, None].repeat(offsets.size, axis=2)
  neighbour = np.take_along_axis(tokens, np.clip(where, 0, args.length - 1).reshape(args.batch, -1),
                                 axis=1).reshape(where.shape)
  start, stop = indptr[centre], indptr[centre + 1]
  present = (rng.random(centre.shape) < args.hit_rate) & (stop > start)
  column = indices[np.minimum(start + (rng.random(centre.shape) * (stop - start)).astype(np.int64), indices.size - 1)]
  neighbour = np.where(inside, np.where(present, column, neighbour), -1)
  return centre.astype(np.int32), neighbour.astype(np.int32)


def numpy_reference(indptr, indices, log_x, rows, cols, vocab):
  """found, log_x by np.searchsorted over int64 flat keys (independent of both peers)."""
  keys = np.repeat(np.arange(vocab, dtype=np.int64), np.diff(indptr)) * vocab + indices
  q = np.where((cols >= 0) & (rows >= 0), rows.astype(np.int64) * vocab + cols, -1)
  pos = np.minimum(np.searchsorted(keys, q), keys.size - 1)
  found = keys[pos] == q
  return found, np.where(found, log_x[pos], 0.0).astype(np.float32)


def flat_keys_lookup(method: str, vocab: int) -> Callable:
  def fn(keys, values, rows, cols):
    q = jnp.where((rows >= 0) & (cols >= 0), rows * vocab + cols, -1)
    pos = jnp.minimum(jnp.searchsorted(keys, q, method=method), keys.shape[0] - 1)
    found = keys[pos] == q
    return cooc_lookup.CoocLookup(log_x=jnp.where(found, values[pos], 0.0), found=found)

  return jax.jit(fn)


def _time(fn: Callable, *args) -> float:
  start = time.perf_counter()
  jax.block_until_ready(fn(*args))
  return time.perf_counter() - start


def main(argv: list[str] | None = None) -> dict[str, Any]:
  args = parse_args(argv)
  rng = np.random.default_rng(args.seed)
  start = time.perf_counter()
  indptr, indices, log_x = random_table(rng, args.vocab, args.nnz)
  nnz = indices.size
  rows, cols = batch_queries(rng, args, indptr, indices)
  more = [batch_queries(rng, args, indptr, indices) for _ in range(args.stack)]
  stacked = [np.concatenate([q[k] for q in more]) for k in (0, 1)]
  print(f"table: V {args.vocab:,}, nnz {nnz:,} ({(indices.nbytes + log_x.nbytes) / 2**20:,.0f} MB), longest "
        f"row {int(np.diff(indptr).max()):,}, {cooc_lookup.search_steps(nnz, args.vocab)} search steps; built "
        f"in {time.perf_counter() - start:.1f} s", flush=True)
  flat = np.repeat(np.arange(args.vocab, dtype=np.int32), np.diff(indptr)) * np.int32(args.vocab) + indices
  device = jax.devices()[0]
  table = [jax.device_put(a, device) for a in (indptr, indices, log_x)]
  keys = [jax.device_put(a, device) for a in (flat, log_x)]
  peers = {"ours": (jax.jit(cooc_lookup.lookup), table),
           "ours[unrolled]": (jax.jit(functools.partial(cooc_lookup.lookup, unroll=True)), table),
           "ours[rolled]": (jax.jit(functools.partial(cooc_lookup.lookup, unroll=False)), table)}
  for method in METHODS:
    if method == "sort" and nnz > _SORT_MAX_NNZ:
      continue  # It sorts the whole table with the queries on every call: seconds per batch at 25M.
    peers[f"searchsorted[{method}]"] = (flat_keys_lookup(method, args.vocab), keys)

  found, expected = numpy_reference(indptr, indices, log_x, rows, cols, args.vocab)
  compile_s = {}
  for name, (fn, tab) in peers.items():
    begin = time.perf_counter()
    out = jax.block_until_ready(fn(*tab, rows, cols))
    compile_s[name] = time.perf_counter() - begin
    if not (np.array_equal(np.asarray(out.found), found) and np.array_equal(np.asarray(out.log_x), expected)):
      raise SystemExit(f"{name} disagrees with the NumPy reference")
    jax.block_until_ready(fn(*tab, *stacked))
  times: dict[str, list[float]] = {name: [] for name in peers}
  stacked_times: dict[str, list[float]] = {name: [] for name in peers}
  for _ in range(args.repeats):
    for name, (fn, tab) in peers.items():
      times[name].append(_time(fn, *tab, rows, cols))
  for _ in range(max(3, args.repeats // 10)):
    for name, (fn, tab) in peers.items():
      stacked_times[name].append(_time(fn, *tab, *stacked))
  per_batch = {name: statistics.median(t) for name, t in times.items()}
  per_query = {name: statistics.median(t) / stacked[0].size * 1e9 for name, t in stacked_times.items()}

  queries = rows.size
  print(f"\none batch: {args.batch} x {args.length}, {rows.shape[1]} masked slots per row x {2 * args.window} "
        f"neighbours = {queries:,} pairs ({found.mean():.0%} in the table); device {device.device_kind}; median of "
        f"{args.repeats}")
  print(f"{'peer':<26} {'ms / batch':>11} {'ns / query':>11}   {'(x' + str(args.stack) + ' batches per call)':<24} "
        f"{'compile s':>9}")
  for name in peers:
    print(f"{name:<26} {per_batch[name] * 1e3:>11.3f} {per_query[name]:>11.1f}   {'':<24} {compile_s[name]:>9.2f}")
  peer = min((n for n in peers if not n.startswith("ours")), key=per_batch.get)
  result = {
      "bench": "cooc_lookup", "device": device.device_kind, "vocab": args.vocab, "nnz": nnz,
      "queries_per_batch": queries, "found_share": float(found.mean()),
      "search_steps": cooc_lookup.search_steps(nnz, args.vocab),
      "seconds_per_batch": per_batch["ours"], "peer": peer, "peer_seconds_per_batch": per_batch[peer],
      "ratio": per_batch[peer] / per_batch["ours"],
      "per_query_ns": per_query, "seconds_per_batch_all": per_batch, "repeats": args.repeats,
  }
  print(f"\nours {per_batch['ours'] * 1e3:.3f} ms per batch; fastest flat-key peer {peer} "
        f"{per_batch[peer] * 1e3:.3f} ms: ratio {result['ratio']:.2f}x (peer / ours)")
  line = json.dumps(result)
  if args.output:
    with open(args.output, "w", encoding="utf-8") as f:
      f.write(line + "\n")
  print(line, flush=True)
  return result


if __name__ == "__main__":
  main(sys.argv[1:])
