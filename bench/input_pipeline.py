"""Input pipeline: batches delivered to the train loop by seqio (tf.data) vs a packed cache (Grain + ArrayRecord).

Both sides are what `DataSource.batches` returns, the loop's one call for data, on the same task, rows and batch shape
(default: the Bible mixture `bible_grc_en_mlm_tlm`, 32 x 512): seqio tokenises and packs on the fly; the
cache reads the same pipeline's rows, written once by `xalign cache`, with one Grain reader
thread (one CPU core's worth of input work). Measured per side: start-up to the first batch (seqio: building
the pipeline and filling its shuffle buffer; cache: opening it, sha256 of every shard, first read) and
row-tokens per second over the next batches. A row-token is one slot of the [batch, length] batch (padding
included, as the device computes it); the rate of non-padding tokens is printed too.

It also prints the rate an H100 needs to train XLM-R base at 45% MFU (989 dense bf16 TFLOP/s), from our own
FLOP count (`flax_xalign.models.flops`): the cache should stay above it on one core.

  python bench/input_pipeline.py                       # builds a 4,096-row cache in a temporary folder
  python bench/input_pipeline.py --cache=/data/bible   # an existing cache (OUTPUT of `xalign cache`)

The last printed line is one JSON object (also written to bench/results/input_pipeline.json); `ratio` is
cache tokens/s over seqio tokens/s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "input_pipeline.json")
H100_BF16_FLOPS = 989e12


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--task", default="bible_grc_en_mlm_tlm")
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--length", type=int, default=512)
  parser.add_argument("--seqio_batches", type=int, default=20, help="timed seqio batches after the first")
  parser.add_argument("--cache_batches", type=int, default=400, help="timed cache batches after the first")
  parser.add_argument("--rows", type=int, default=4096, help="rows of the cache built when --cache is not given")
  parser.add_argument("--cache", help="an existing cache folder (its train split must fit --task/--length)")
  parser.add_argument("--threads", type=int, default=1, help="Grain reader threads (1: one core)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--output", default=_RESULTS)
  return parser.parse_args(argv)


def _timed(make_batches, count: int) -> dict[str, float]:
  """Start-up (`make_batches()` and the first batch), then rates over `count` more batches."""
  start = time.perf_counter()
  batches = make_batches()
  first = next(batches)
  first_s = time.perf_counter() - start
  slots = real = 0
  start = time.perf_counter()
  for _ in range(count):
    batch = next(batches)
    slots += batch["tokens"].size
    real += int(np.count_nonzero(batch["segment_ids"]))
  took = time.perf_counter() - start
  assert first["tokens"].dtype == np.int32
  return {"first_batch_s": first_s, "tokens_per_sec": slots / took, "real_tokens_per_sec": real / took,
          "batches": count, "seconds": took}


def _needed_rate(length: int) -> float:
  from flax_xalign.models import config as config_lib
  from flax_xalign.models import flops
  from flax_xalign.objectives.masking import max_predictions_for

  config = config_lib.preset("base", vocab_size=250_002)
  per_step = flops.train_flops_per_step(config, batch=1, length=length,
                                        num_predictions=max_predictions_for(length, 0.15))
  return 0.45 * H100_BF16_FLOPS / (per_step / length)


def main(argv: list[str] | None = None) -> dict:
  args = parse_args(argv)
  from flax_xalign.training.data import resolve_task

  layout = dict(feature_lengths={"tokens": args.length}, batch_size=args.batch, seed=args.seed)
  print(f"task {args.task}, batches of {args.batch} x {args.length}", flush=True)
  seqio = _timed(lambda: resolve_task(args.task).batches(**layout), args.seqio_batches)

  with tempfile.TemporaryDirectory() as tmp:
    cache = args.cache
    if cache is None:
      from flax_xalign.training import cache_job

      cache = os.path.join(tmp, "cache")
      build = time.perf_counter()
      cache_job.write_cache(cache_job.CacheJob(task=args.task, output=cache, length=args.length, examples=args.rows,
                                               seed=args.seed))
      print(f"built the cache in {time.perf_counter() - build:.1f} s", flush=True)
    from flax_xalign.data.packed import format as format_lib
    from flax_xalign.data.packed import read

    cached = _timed(lambda: read.PackedBatches(format_lib.open_split(cache, "train"), batch_size=args.batch,
                                               seed=args.seed, num_threads=args.threads), args.cache_batches)

  needed = _needed_rate(args.length)
  ratio = cached["tokens_per_sec"] / seqio["tokens_per_sec"]
  print(f"\n{'side':<28}{'first batch':>12}{'tokens/s':>14}{'non-pad tok/s':>15}")
  for name, side in (("seqio (tf.data, on the fly)", seqio), (f"cache (Grain, {args.threads} thread)", cached)):
    print(f"{name:<28}{side['first_batch_s']:>11.2f}s{side['tokens_per_sec']:>14,.0f}"
          f"{side['real_tokens_per_sec']:>15,.0f}")
  print(f"\ncache / seqio: {ratio:.1f}x tokens/s, start-up {seqio['first_batch_s'] / cached['first_batch_s']:.1f}x "
        "faster")
  print(f"an H100 at 45% MFU on XLM-R base (length {args.length}) consumes {needed:,.0f} tokens/s: the cache "
        f"delivers {cached['tokens_per_sec'] / needed:.1f}x that, seqio {seqio['tokens_per_sec'] / needed:.2f}x")
  result = {"task": args.task, "batch": args.batch, "length": args.length, "threads": args.threads,
            "seqio": seqio, "cache": cached, "h100_xlmr_base_45pct_tokens_per_sec": needed, "ratio": ratio,
            "startup_ratio": seqio["first_batch_s"] / cached["first_batch_s"]}
  os.makedirs(os.path.dirname(args.output), exist_ok=True)
  with open(args.output, "w") as f:
    json.dump(result, f, indent=1)
  print(json.dumps(result))
  return result


if __name__ == "__main__":
  main()
