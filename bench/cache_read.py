"""Reading a packed cache from disk, not from the page cache: verification at start-up and rows/s of batches.

A cache larger than memory is read from disk at every start and every batch. This bench evicts the
cache's files from the page cache (`fsync`, then `posix_fadvise(POSIX_FADV_DONTNEED)` on each file)
before each measurement and times, on one cache split:

  hash      sha256_of of every shard, cold and again warm (MB/s: what "full" verification costs)
  start-up  `format.open_split` cold in each verification mode ("full": sha256 of every shard;
            "size": sizes, record counts and a seeded sample of records), the time a run's start spends
  read      `PackedBatches` (seeded global shuffle, Grain, `--threads` reader threads) cold: time to the
            first batch and rows/s over `--batches` batches of `--batch` x `--length`

and compares the read rate with the rows an H100 consumes training XLM-R base at `--mfu` of its dense bf16
peak (989 TFLOP/s, `flax_xalign.models.flops`' table), from the standard model-FLOP count
(`flops.model_train_flops`: a full row of one segment, 15% of its tokens predicted).

  python bench/cache_read.py --gib=1                    # writes a ~1 GiB synthetic cache, measures, deletes it
  python bench/cache_read.py --cache=/data/bible        # an existing cache's train split (never written to)

The synthetic cache holds random rows in XLM-R's layout (250,002-piece vocabulary: uint32 tokens) written
by `write.write_split`. The last printed line is one JSON object (also written to
bench/results/cache_read.json); `ratio` is the cold read's rows/s over the H100's.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "cache_read.json")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--cache", help="an existing cache folder (its train split is read); default: a synthetic one")
  parser.add_argument("--gib", type=float, default=1.0, help="size of the synthetic cache's shards in GiB")
  parser.add_argument("--workdir", help="where the synthetic cache is written (default: a temporary folder)")
  parser.add_argument("--shard_mb", type=int, default=256, help="shard size of the synthetic cache in MiB")
  parser.add_argument("--vocab", type=int, default=250_002, help="vocabulary of the synthetic rows (XLM-R's)")
  parser.add_argument("--batch", type=int, default=64)
  parser.add_argument("--length", type=int, default=512)
  parser.add_argument("--batches", type=int, default=100, help="timed batches after the first")
  parser.add_argument("--threads", type=int, default=2, help="Grain reader threads")
  parser.add_argument("--mfu", type=float, default=0.4)
  parser.add_argument("--peak_tflops", type=float, default=None, help="default: flops' H100 entry (989)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--output", default=_RESULTS)
  return parser.parse_args(argv)


def evict(paths: list[str]) -> None:
  """Drops `paths` from the page cache (dirty pages are written first, so all of them can go)."""
  for path in paths:
    fd = os.open(path, os.O_RDONLY)
    try:
      os.fsync(fd)
      os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
      os.close(fd)


def _synthetic_rows(count: int, *, length: int, vocab: int, seed: int):
  """Rows shaped like packed XLM-R rows: random tokens, 1-4 segments with their positions, two languages."""
  rng = np.random.default_rng(seed)
  slots = np.arange(length)
  for _ in range(count):
    cuts = np.sort(rng.choice(np.arange(1, length), size=rng.integers(0, 4), replace=False))
    segment = np.searchsorted(cuts, slots, side="right") + 1
    starts = np.concatenate([[0], cuts])[segment - 1]
    yield {"tokens": rng.integers(5, vocab, length), "lang_ids": np.full(length, rng.integers(1, 3)),
           "segment_ids": segment, "positions": slots - starts, "pair_side": np.zeros(length, np.int64)}


def write_synthetic(output: str, *, gib: float, length: int, vocab: int, shard_mb: int, seed: int) -> float:
  """Writes the train split of a synthetic cache of ~`gib` GiB of shards at `output`; returns seconds taken."""
  from flax_xalign.data.packed import write
  from flax_xalign.data.vocab.spec import VocabularySpec

  vocabulary = b"synthetic vocabulary: not a tokenizer"
  spec = VocabularySpec(file="vocabulary.model", sha256=hashlib.sha256(vocabulary).hexdigest(), size=vocab,
                        pieces=vocab)

  def split(rows: int, folder: str):
    info = write.split_info(task="synthetic", split="train", length=length, pack=True, pair_layout="restart",
                            both_directions=False, languages=("de", "en"), language_pairs=(), vocabulary=spec,
                            task_definitions=None, seed=seed, order={"mode": "in order", "examples": rows})
    return write.write_split(_synthetic_rows(rows, length=length, vocab=vocab, seed=seed), info, output=folder,
                             vocabulary_bytes=vocabulary, shard_bytes=shard_mb << 20, log=io.StringIO())

  with tempfile.TemporaryDirectory() as probe:  # Bytes per row on disk (ArrayRecord compresses each record).
    trial = split(2000, probe)
    per_row = sum(s.bytes for s in trial.shards) / trial.examples
  start = time.perf_counter()
  split(max(64, int(gib * 2**30 / per_row)), output)
  return time.perf_counter() - start


def needed_rows_per_sec(length: int, *, mfu: float, peak: float) -> tuple[float, float]:
  """(rows/s, model FLOPs per row) of XLM-R base training on full rows of `length` at `mfu` of `peak` FLOP/s."""
  from flax_xalign.models import config as config_lib
  from flax_xalign.models import flops

  config = config_lib.preset("base", vocab_size=250_002)
  counts = flops.count_tokens(np.ones((1, length), np.int32), mask_rate=0.15)
  per_row = flops.model_train_flops(config, counts)
  return mfu * peak / per_row, per_row


def _time(call):
  start = time.perf_counter()
  value = call()
  return time.perf_counter() - start, value


def measure(root: str, *, batch: int, batches: int, threads: int, seed: int) -> dict:
  from flax_xalign.data.packed import format as format_lib
  from flax_xalign.data.packed import read
  from flax_xalign.data.sources.wheels import sha256_of

  packed = format_lib.open_split(root, "train", verify="size")
  paths, total = packed.paths, sum(s.bytes for s in packed.manifest.shards)
  out = {"bytes": total, "shards": len(paths), "rows": packed.manifest.examples, "length": packed.manifest.length}
  evict(paths)
  cold, _ = _time(lambda: [sha256_of(p) for p in paths])
  warm, _ = _time(lambda: [sha256_of(p) for p in paths])
  out["hash_cold_mb_s"], out["hash_warm_mb_s"] = total / cold / 1e6, total / warm / 1e6
  for mode in ("full", "size"):
    evict(paths)
    out[f"open_{mode}_cold_s"], _ = _time(lambda: format_lib.open_split(root, "train", verify=mode))
  evict(paths)
  start = time.perf_counter()
  reader = read.PackedBatches(format_lib.open_split(root, "train", verify="size"), batch_size=batch, seed=seed,
                              num_threads=threads)
  first = next(reader)
  out["first_batch_cold_s"] = time.perf_counter() - start
  start = time.perf_counter()
  for _ in range(batches):
    next(reader)
  took = time.perf_counter() - start
  assert first["tokens"].shape == (batch, out["length"])
  out.update(batch=batch, batches=batches, threads=threads, read_s=took, rows_per_sec=batch * batches / took)
  return out


def main(argv: list[str] | None = None) -> dict:
  args = parse_args(argv)
  from flax_xalign import fileio
  from flax_xalign.models import flops

  peak = args.peak_tflops * 1e12 if args.peak_tflops else flops.peak_flops_per_device("NVIDIA H100")
  with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
    root, wrote = args.cache, None
    if root is None:
      root = os.path.join(tmp, "cache")
      wrote = write_synthetic(root, gib=args.gib, length=args.length, vocab=args.vocab, shard_mb=args.shard_mb,
                              seed=args.seed)
      print(f"wrote a synthetic cache ({args.gib:g} GiB) in {wrote:.0f} s", flush=True)
    result = measure(root, batch=args.batch, batches=args.batches, threads=args.threads, seed=args.seed)
    if args.cache is None:
      shutil.rmtree(root)
  needed, per_row = needed_rows_per_sec(result["length"], mfu=args.mfu, peak=peak)
  result.update(write_s=wrote, h100_rows_per_sec=needed, flops_per_row=per_row, mfu=args.mfu, peak_flops=peak,
                ratio=result["rows_per_sec"] / needed)
  gb = result["bytes"] / 1e9
  print(f"\ncache: {result['rows']:,} rows of {result['length']}, {gb:.2f} GB in {result['shards']} shard(s)")
  print(f"{'measurement (page cache evicted first)':<44}{'value':>16}")
  rows = [("sha256 of every shard, cold", f"{result['hash_cold_mb_s']:,.0f} MB/s"),
          ("sha256 of every shard, warm", f"{result['hash_warm_mb_s']:,.0f} MB/s"),
          ("start-up: open_split verify='full'", f"{result['open_full_cold_s']:.2f} s"),
          ("start-up: open_split verify='size'", f"{result['open_size_cold_s']:.3f} s"),
          ("first batch (open 'size' + read)", f"{result['first_batch_cold_s']:.3f} s"),
          (f"read, {args.threads} thread(s), {args.batch} x {result['length']}",
           f"{result['rows_per_sec']:,.0f} rows/s")]
  for name, value in rows:
    print(f"{name:<44}{value:>16}")
  print(f"\nan H100 at {args.mfu:.0%} MFU ({peak / 1e12:.0f} TFLOP/s) on XLM-R base consumes {needed:,.0f} rows of "
        f"{result['length']}/s ({per_row / 1e9:.0f} GFLOP per row); the cold read delivers {result['ratio']:.1f}x that")
  fileio.write_atomically(args.output, json.dumps(result, indent=1))
  print(json.dumps(result), flush=True)
  return result


if __name__ == "__main__":
  main()
