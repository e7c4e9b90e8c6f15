r"""Co-occurrence counting (MLM-GC §3.2): our counter vs a SciPy `coo_matrix` counter on the same tokens.

  python bench/cooc.py                          # the embedded Bible (grc + en), tiled to 30M tokens, n = 2
  python bench/cooc.py --source zipf --vocab 32000 --tokens 30000000
  python bench/cooc.py --quick                  # smoke run (~1M tokens)

Tokens: `--source bible` reads the train split of the embedded Bible mixture
`bible_grc_en_mlm_tlm` once (every side of every example a sequence: English
and Greek verses and both sides of the bitext; 8000-piece vocabulary) and
tiles each language's sequences until the corpus has `--tokens` tokens;
`--source zipf` draws ids from a Zipf law (exponent 1.1, ranks shuffled over
`--vocab` ids) in sentences of log-normal length (median 24), two languages
of 2:1 size. Both counters get the same in-memory flat ids per language.

* **Ours**: `flax_xalign.data.cooc.PairCounter.add_batch` per language (flat
  ids + sequence lengths), then `result()`: exact int64 C[lang, d, a, b]. The
  per-sequence API (`count_sequences` over (lang, ids) tuples, what Beam calls)
  is timed too, on the same tokens.
* **SciPy**: the counter users would write: for each (lang, d), the pairs
  (x_i, x_{i+d}) inside sequences as `coo_matrix((ones, (a, b)), (V, V))` over
  the whole corpus, `.tocsr()` summing duplicates (int64 counts).

Counting time excludes reading the data. The integer tables must be exactly
equal before anything is timed; then both build the float table the same way
(per language sorted, d ascending: X += c_lang * ((C + C^T) / (d + 1))) and
log X must be bit-equal (max |diff| is printed). `--rounds` alternates
ours/SciPy and reports the median. Output: a table, then one JSON line
(also written to bench/results/cooc.json).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))

from flax_xalign import fileio
from flax_xalign.data import cooc

_RESULTS = os.path.join(_HERE, "results", "cooc.json")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--source", choices=("bible", "zipf"), default="bible")
  parser.add_argument("--tokens", type=int, default=30_000_000, help="corpus size after tiling / drawing")
  parser.add_argument("--vocab", type=int, default=32_000, help="--source zipf: vocabulary size")
  parser.add_argument("--window", type=int, default=2)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--threads", type=int, default=2, help="our counter's worker threads")
  parser.add_argument("--skip_sequences", action="store_true", help="do not time the per-sequence API")
  parser.add_argument("--quick", action="store_true", help="~1M tokens, 1 round")
  parser.add_argument("--output", default=_RESULTS)
  args = parser.parse_args(argv)
  if args.quick:
    args.tokens, args.rounds = min(args.tokens, 1_000_000), 1
  return args


# ---------------------------------------------------------------- tokens


def bible_tokens() -> tuple[tuple[str, ...], int, list[tuple[np.ndarray, np.ndarray]]]:
  """(languages, V, [(flat ids, lengths)] per language) of the embedded Bible mixture's train split."""
  from flax_xalign import tasks
  from flax_xalign.tasks import cooc_input

  task = "bible_grc_en_mlm_tlm"
  languages = tuple(tasks.languages_of(task))
  vocab_size = int(tasks.get_vocabulary(task).vocab_size)
  parts: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in languages]
  stats = {"examples": 0, "skipped": 0}
  for lang, ids, lengths in cooc_input.task_batches(task, split="train", languages=languages,
                                                    vocab_size=vocab_size, stats=stats):
    parts[lang].append((ids.astype(np.int32), lengths.astype(np.int64)))
  return languages, vocab_size, [(np.concatenate([p[0] for p in ps]), np.concatenate([p[1] for p in ps]))
                                 for ps in parts]


def zipf_tokens(total: int, vocab_size: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
  rng = np.random.default_rng(seed)
  out = []
  for share in (2 / 3, 1 / 3):
    n = int(total * share)
    lengths = np.maximum(1, rng.lognormal(np.log(24), 0.6, size=n // 12)).astype(np.int64)
    lengths = lengths[:np.searchsorted(np.cumsum(lengths), n) + 1]
    lengths[-1] -= lengths.sum() - n
    ranks = rng.zipf(1.1, size=int(n * 1.3))
    ranks = ranks[ranks <= vocab_size][:n] - 1
    while len(ranks) < n:
      more = rng.zipf(1.1, size=n)
      ranks = np.concatenate([ranks, more[more <= vocab_size][:n - len(ranks)] - 1])
    out.append((rng.permutation(vocab_size)[ranks].astype(np.int32), lengths[lengths > 0]))
  return out


def tile(data: list[tuple[np.ndarray, np.ndarray]], total: int) -> list[tuple[np.ndarray, np.ndarray]]:
  """Each language's sequences repeated (whole sequences) so that the corpus has about `total` tokens."""
  have = sum(len(ids) for ids, _ in data)
  reps = max(1, round(total / have))
  return [(np.tile(ids, reps), np.tile(lengths, reps)) for ids, lengths in data]


# ---------------------------------------------------------------- counters


def ours(data, *, languages, vocab_size, window, threads) -> cooc.PairCounts:
  counter = cooc.PairCounter(languages=languages, vocab_size=vocab_size, window=window, threads=threads)
  for lang, (ids, lengths) in enumerate(data):
    counter.add_batch(lang, ids, lengths)
  return counter.result()


def ours_sequences(sequences, *, languages, vocab_size, window, threads) -> cooc.PairCounts:
  return cooc.count_sequences(sequences, languages=languages, vocab_size=vocab_size, window=window, threads=threads)


def scipy_counts(data, *, vocab_size, window) -> dict[tuple[int, int], Any]:
  """{(lang, d): int64 CSR C[lang, d]}: coo_matrix over all pairs, duplicates summed by tocsr()."""
  from scipy import sparse

  out = {}
  for lang, (ids, lengths) in enumerate(data):
    ends = np.repeat(np.cumsum(lengths), lengths)
    position = np.arange(len(ids))
    for d in range(1, window + 1):
      inside = ends[:-d] > position[:-d] + d
      a, b = ids[:-d][inside], ids[d:][inside]
      out[(lang, d)] = sparse.coo_matrix((np.ones(len(a), np.int64), (a, b)), shape=(vocab_size, vocab_size)).tocsr()
  return out


def scipy_table(matrices, tokens, *, languages, reference) -> Any:
  """X = sum over languages (sorted), d ascending, of c_lang * ((C + C^T) / (d + 1)) (float64 CSR)."""
  from scipy import sparse

  ref = int(tokens[languages.index(reference)])
  x = None
  for (lang, d), c in sorted(matrices.items()):
    term = ((c + c.T).tocsr().astype(np.float64) / (d + 1)) * (ref / int(tokens[lang]))
    x = term if x is None else (x + term)
  x = sparse.csr_matrix(x)
  x.sum_duplicates()
  x.sort_indices()
  return x


def as_keys(matrices, *, vocab_size, window) -> tuple[np.ndarray, np.ndarray]:
  keys, counts = [], []
  for (lang, d), c in sorted(matrices.items()):
    c = c.tocoo()
    k = ((np.int64(lang) * window + d - 1) * vocab_size + c.row.astype(np.int64)) * vocab_size + c.col
    order = np.argsort(k)
    keys.append(k[order])
    counts.append(c.data[order])
  return np.concatenate(keys), np.concatenate(counts)


# ---------------------------------------------------------------- main


def timed(fn, *args, **kwargs) -> tuple[Any, float]:
  start = time.perf_counter()
  out = fn(*args, **kwargs)
  return out, time.perf_counter() - start


def main(argv: list[str] | None = None) -> dict[str, Any]:
  args = parse_args(argv)
  if args.source == "bible":
    languages, vocab_size, base = bible_tokens()
    data = tile(base, args.tokens)
    what = f"embedded Bible train (grc + en, {sum(len(i) for i, _ in base):,} tokens) tiled"
  else:
    languages, vocab_size = ("de", "en"), args.vocab
    data = zipf_tokens(args.tokens, vocab_size)
    what = "Zipf(1.1) ids, log-normal sentence lengths (median 24)"
  total = sum(len(ids) for ids, _ in data)
  sequences_total = sum(len(lengths) for _, lengths in data)
  kwargs = {"vocab_size": vocab_size, "window": args.window}
  print(f"tokens: {what}: {total:,} tokens in {sequences_total:,} sequences, V = {vocab_size:,}, "
        f"languages {', '.join(f'{c} {len(i):,}' for c, (i, _) in zip(languages, data))}, window ±{args.window}",
        flush=True)

  # Equality first: exact integer counts, then the float table bit for bit.
  mine = ours(data, languages=languages, threads=args.threads, **kwargs)
  matrices = scipy_counts(data, **kwargs)
  keys, counts = as_keys(matrices, **kwargs)
  if not (np.array_equal(keys, mine.keys) and np.array_equal(counts, mine.counts)):
    raise SystemExit("the integer tables differ: ours and SciPy's counts are not equal")
  reference, _ = cooc.reference_of(mine, "en")
  table, finalize_s = timed(cooc.finalize, mine, reference_language="en")
  x, scipy_table_s = timed(scipy_table, matrices, mine.tokens, languages=languages, reference=reference)
  scipy_log = np.log(x.data).astype(np.float32)
  same_shape = np.array_equal(x.indptr, table.indptr) and np.array_equal(x.indices, table.indices)
  max_diff = float(np.max(np.abs(scipy_log - table.log_x))) if same_shape else float("inf")
  bit_equal = same_shape and scipy_log.tobytes() == table.log_x.tobytes()
  print(f"equal: integer counts exact ({len(mine.keys):,} (lang, d, a, b) cells, {int(mine.counts.sum()):,} "
        f"pairs); float table {'bit-equal' if bit_equal else 'DIFFERENT'} ({table.info['nnz']:,} entries, "
        f"max |diff log X| {max_diff:g})", flush=True)
  del matrices, x

  sequences = None
  if not args.skip_sequences:
    sequences = [(lang, s) for lang, (ids, lengths) in enumerate(data)
                 for s in np.split(ids, np.cumsum(lengths)[:-1])]
  times: dict[str, list[float]] = {"ours": [], "ours_sequences": [], "scipy": []}
  for _ in range(args.rounds):
    times["ours"].append(timed(ours, data, languages=languages, threads=args.threads, **kwargs)[1])
    if sequences is not None:
      times["ours_sequences"].append(
          timed(ours_sequences, sequences, languages=languages, threads=args.threads, **kwargs)[1])
    times["scipy"].append(timed(scipy_counts, data, **kwargs)[1])
  median = {k: float(np.median(v)) for k, v in times.items() if v}
  rate = {k: total / v for k, v in median.items()}

  print()
  print(f"{'counter':<44} {'seconds':>8} {'M tokens/s':>11} {'vs SciPy':>9}")
  rows = [("ours: PairCounter.add_batch (flat ids)", "ours"),
          ("ours: count_sequences ((lang, ids) tuples)", "ours_sequences"),
          ("SciPy coo_matrix(...).tocsr() per (lang, d)", "scipy")]
  for label, key in rows:
    if key in median:
      print(f"{label:<44} {median[key]:>8.2f} {rate[key] / 1e6:>11.2f} {rate[key] / rate['scipy']:>8.2f}x")
  print(f"{'finalize (float table, log, CSR): ours':<44} {finalize_s:>8.2f}")
  print(f"{'finalize: SciPy (C + C^T) / (d+1) * c_lang':<44} {scipy_table_s:>8.2f}")
  print(f"(median of {args.rounds} rounds, {args.threads} worker threads, {os.cpu_count()} cores; "
        f"load average {os.getloadavg()[0]:.1f})")
  result = {
      "source": args.source, "tokens": total, "sequences": sequences_total, "vocab_size": vocab_size,
      "languages": list(languages), "window": args.window, "threads": args.threads, "rounds": args.rounds,
      "seconds": median["ours"], "scipy_seconds": median["scipy"],
      "tokens_per_s": rate["ours"], "baseline_tokens_per_s": rate["scipy"], "ratio": rate["ours"] / rate["scipy"],
      "sequences_api_tokens_per_s": rate.get("ours_sequences"), "counts_equal": True, "table_bit_equal": bit_equal,
      "table_max_abs_diff": max_diff, "nnz": table.info["nnz"], "finalize_seconds": finalize_s,
      "scipy_table_seconds": scipy_table_s, "load_average": os.getloadavg()[0], "cores": os.cpu_count(),
  }
  if args.output:
    fileio.write_atomically(args.output, json.dumps(result, indent=2))
  print(json.dumps(result), flush=True)
  return result


if __name__ == "__main__":
  main()
