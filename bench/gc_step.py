"""Step cost of MLM-GC (Eq. 3 and Eq. 6) over MLM at the same batch, and the table lookup alone.

All sides are the exact `flax_xalign.training.trainer.Trainer` step (masking,
encoder, MLM logits at the masked slots, AdamW, jit with donated state, assets
passed as step arguments) on the same batches of packed monolingual rows. GC
adds, per masked slot, the 2n neighbours' ids and rules, a binary search per
pair in the CSR co-occurrence table and a [slots, 2n] regression: for Eq. 3 a
gather of the neighbours' hidden states and their dot products, for Eq. 6 a
gather from the MLM logits the step already has. Rounds alternate the sides
(the first step of a side in a round is a warm-up, not timed); medians are
compared. Target: MLM-GC <= 1.15x MLM.

The table is realistic in size: every pair the bench batches really have
within ±n (so the lookups hit, as on a counted corpus) plus random pairs to about
`--nnz` entries, Zipf-distributed over rows like a corpus's. The lookup alone
(jitted, the batch's [batch, slots, 2n] queries) is timed separately.

  python bench/gc_step.py                    # 4 layers x 256, vocab 8000, batch 16 x 128, 2M entries
  python bench/gc_step.py --layers=12 --embed=768 --heads=12 --mlp=3072 --vocab=30000 \\
      --batch=32 --length=256 --nnz=30000000 --dtype=bfloat16          # an accelerator
  python bench/gc_step.py --quick            # seconds: a smoke run

The last printed line is one JSON object (also written to bench/results/gc_step.json).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import numpy as np
from train_step_side import Side, print_ratio_table, write_result

_RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "gc_step.json")
_BOS, _EOS, _FIRST_REGULAR = 3, 1, 5
_TARGET = 1.15
_SIDES = (("MLM", {"mlm": 1.0}, None), ("MLM+GC Eq.3", {"mlm": 1.0, "gc": 1.0}, "hidden"),
          ("MLM+GC Eq.6", {"mlm": 1.0, "gc": 1.0}, "output"))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--layers", type=int, default=4)
  parser.add_argument("--embed", type=int, default=256)
  parser.add_argument("--heads", type=int, default=4)
  parser.add_argument("--mlp", type=int, default=1024)
  parser.add_argument("--vocab", type=int, default=8000)
  parser.add_argument("--nnz", type=int, default=2_000_000, help="entries of the co-occurrence table")
  parser.add_argument("--window", type=int, default=2, help="n of the ±n window (table and objective)")
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--length", type=int, default=128)
  parser.add_argument("--dtype", default="float32", help="compute dtype (bfloat16 on accelerators)")
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--steps", type=int, default=5, help="timed steps per side per round")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--quick", action="store_true", help="tiny sizes, 2 rounds of 2 steps (a smoke test)")
  parser.add_argument("--output", default=_RESULTS)
  args = parser.parse_args(argv)
  if args.quick:
    args.layers, args.embed, args.heads, args.mlp, args.vocab, args.nnz = 2, 32, 2, 64, 301, 5000
    args.batch, args.length, args.rounds, args.steps = 4, 32, 2, 2
  return args


def batches(rng: np.random.Generator, *, count: int, batch: int, length: int, vocab: int) -> list[dict]:
  """Rows of packed `<s> text </s>` sentences with Zipfian ids (two languages alternate rows), padding at the end."""
  regular = vocab - _FIRST_REGULAR
  out = []
  for _ in range(count):
    feats = {k: np.zeros((batch, length), np.int32)
             for k in ("tokens", "lang_ids", "segment_ids", "positions", "pair_side")}
    for r in range(batch):
      cursor, segment = 0, 1
      while cursor < length - 8:
        n = int(rng.integers(6, 40))
        text = _FIRST_REGULAR + (rng.zipf(1.3, n) - 1) % regular
        sentence = np.concatenate([[_BOS], text, [_EOS]])[:length - cursor]
        span = slice(cursor, cursor + len(sentence))
        feats["tokens"][r, span] = sentence
        feats["lang_ids"][r, span] = 1 + r % 2
        feats["segment_ids"][r, span] = segment
        feats["positions"][r, span] = np.arange(len(sentence))
        cursor += len(sentence)
        segment += 1
    out.append(feats)
  return out


def table(rng: np.random.Generator, data: list[dict], *, vocab: int, nnz: int, window: int) -> dict[str, np.ndarray]:
  """CSR arrays: the batches' own pairs within ±window plus Zipf-rowed random pairs, ~nnz in all."""
  keys = []
  for feats in data:
    tokens, segment = feats["tokens"].astype(np.int64), feats["segment_ids"]
    for d in range(1, window + 1):
      a, b = tokens[:, :-d], tokens[:, d:]
      same = (segment[:, :-d] == segment[:, d:]) & (a >= _FIRST_REGULAR) & (b >= _FIRST_REGULAR)
      keys += [(a * vocab + b)[same], (b * vocab + a)[same]]
  real = np.unique(np.concatenate(keys))
  # Row sizes fall off as 1/rank (Zipf, as a corpus's), capped at a quarter of the vocabulary so that random
  # columns rarely repeat; rows are drawn 15% over size and deduplicated, landing near nnz.
  regular = vocab - _FIRST_REGULAR
  share = 1.0 / np.arange(1, regular + 1)
  wanted, cap = max(0, nnz - real.size) * 1.15, max(1, regular // 4)
  low, high = 0.0, wanted * 2 / share[-1]
  for _ in range(60):  # The scale whose capped row sizes add up to `wanted` (bisection).
    scale = (low + high) / 2
    low, high = (scale, high) if np.minimum(scale * share, cap).sum() < wanted else (low, scale)
  sizes = np.ceil(np.minimum(high * share, cap)).astype(np.int64)
  rows = np.repeat(_FIRST_REGULAR + rng.permutation(regular), sizes)
  cols = rng.integers(_FIRST_REGULAR, vocab, rows.size)
  flat = np.unique(np.concatenate([real, rows * vocab + cols]))
  a, b = flat // vocab, flat % vocab
  indptr = np.zeros(vocab + 1, np.int64)
  np.cumsum(np.bincount(a, minlength=vocab), out=indptr[1:])
  log_x = rng.uniform(-1.0, 8.0, flat.size).astype(np.float32)
  return {"indptr": indptr.astype(np.int32), "indices": b.astype(np.int32), "log_x": log_x}


def build_trainer(objectives: dict[str, float], representation: str | None, cooc: dict,
                  args: argparse.Namespace) -> Any:
  from flax_xalign.assets.runtime import RunAssets
  from flax_xalign.models.config import EncoderConfig
  from flax_xalign.models.encoder import Encoder
  from flax_xalign.objectives.model import PretrainingModel
  from flax_xalign.training import partitioning
  from flax_xalign.training.optimizer import OptimizerConfig
  from flax_xalign.training.trainer import LoopConfig, Trainer

  encoder = EncoderConfig(num_layers=args.layers, embed_dim=args.embed, num_heads=args.heads,
                          head_dim=args.embed // args.heads, mlp_dim=args.mlp, vocab_size=args.vocab,
                          max_positions=max(512, args.length), num_languages=2, dtype=args.dtype)
  options = {"gc": {"window": args.window, "representation": representation}} if representation else {}
  model = PretrainingModel(encoder=Encoder(encoder), objectives=objectives, objective_options=options)
  assets = RunAssets.of_values({"cooc": cooc} if "cooc" in model.requires() else {})
  loop = LoopConfig(train_steps=1000, batch_size=args.batch, length=args.length, seed=args.seed)
  partitioner = partitioning.Partitioner(mesh=partitioning.make_mesh(1),
                                         rules=partitioning.logical_axis_rules())
  return Trainer(model=model, optimizer=OptimizerConfig(), partitioner=partitioner, loop=loop, assets=assets)


def lookup_ms(side: Side, args: argparse.Namespace, repeats: int = 20) -> tuple[float, int]:
  """(milliseconds, queries) of the table lookup alone for one batch's [batch, slots, 2n] pairs."""
  import jax
  import jax.numpy as jnp

  from flax_xalign.objectives.gc import neighbour_pairs
  from flax_xalign.ops import cooc_lookup

  trainer = side.trainer
  model = trainer.model
  host = side.host_batch
  masked = model.mask({k: jnp.asarray(v) for k, v in host.items()}, jax.random.key(0))
  pairs = neighbour_pairs({k: jnp.asarray(v) for k, v in host.items()}, masked, model.specials, window=args.window)
  cooc = trainer.assets.device["cooc"]
  fn = jax.jit(lambda t, r, c: cooc_lookup.lookup_table(t, r, c).log_x)
  jax.block_until_ready(fn(cooc, pairs.rows, pairs.cols))
  times = []
  for _ in range(5):
    start = time.perf_counter()
    for _ in range(repeats):
      out = fn(cooc, pairs.rows, pairs.cols)
    jax.block_until_ready(out)
    times.append((time.perf_counter() - start) / repeats)
  return statistics.median(times) * 1e3, int(pairs.rows.size)


def run(args: argparse.Namespace) -> dict[str, Any]:
  import jax

  rng = np.random.default_rng(args.seed)
  data = batches(rng, count=4, batch=args.batch, length=args.length, vocab=args.vocab)
  start = time.perf_counter()
  cooc = table(rng, data, vocab=args.vocab, nnz=args.nnz, window=args.window)
  table_s = time.perf_counter() - start
  nnz = int(cooc["indices"].size)
  sides = []
  for name, objectives, representation in _SIDES:
    side = Side(name, build_trainer(objectives, representation, cooc, args), data)
    side.host_batch = data[0]
    sides.append(side)
  times: dict[str, list[float]] = {s.name: [] for s in sides}
  for r in range(args.rounds):
    for side in sides:
      times[side.name].append(side.timed(args.steps))
    print(f"round {r + 1}/{args.rounds}: " + "  ".join(f"{k} {v[-1] * 1e3:.1f} ms" for k, v in times.items()),
          flush=True)
  ms = [statistics.median(times[s.name]) * 1e3 for s in sides]
  best = [min(times[s.name]) * 1e3 for s in sides]
  flops = [side.flops() for side in sides]
  lookup, queries = lookup_ms(sides[1], args)
  metrics = {f"{key}_{tag}": float(jax.device_get(side.last_metrics[key]))
             for side, tag in ((sides[1], "eq3"), (sides[2], "eq6"))
             for key in side.last_metrics if key.startswith("gc_")}
  return {
      "benchmark": "gc_step",
      "layers": args.layers, "embed": args.embed, "heads": args.heads, "mlp": args.mlp, "vocab": args.vocab,
      "batch": args.batch, "length": args.length, "dtype": args.dtype, "window": args.window,
      "nnz": nnz, "table_mb": sum(v.nbytes for v in cooc.values()) / 2**20, "table_build_s": table_s,
      "mlm_ms": ms[0], "gc_ms": ms[1], "gc_output_ms": ms[2],
      "ratio": ms[1] / ms[0], "ratio_output": ms[2] / ms[0],
      # Fastest round of each side: less sensitive to other load on the machine than the median.
      "ratio_best": best[1] / best[0], "ratio_output_best": best[2] / best[0],
      "flops_ratio": flops[1] / flops[0] if flops[0] and flops[1] else None,
      "flops_ratio_output": flops[2] / flops[0] if flops[0] and flops[2] else None,
      "lookup_ms": lookup, "lookup_queries": queries, "target_ratio": _TARGET,
      **metrics,
      "rounds": args.rounds, "steps": args.steps,
      "backend": jax.default_backend(), "device": jax.devices()[0].device_kind, "devices": jax.device_count(),
  }


def main(argv: list[str] | None = None) -> None:
  args = parse_args(argv)
  result = run(args)
  print_ratio_table(result["mlm_ms"], [("MLM+GC Eq.3", result["gc_ms"], result["ratio"], _TARGET),
                                       ("MLM+GC Eq.6", result["gc_output_ms"], result["ratio_output"], _TARGET)])
  if result["flops_ratio"] is not None:
    print(f"XLA cost-analysis FLOPs over MLM: Eq.3 {result['flops_ratio']:.3f}x, Eq.6 "
          f"{result['flops_ratio_output']:.3f}x; fastest rounds: Eq.3 {result['ratio_best']:.2f}x, "
          f"Eq.6 {result['ratio_output_best']:.2f}x")
  print(f"table lookup alone: {result['lookup_ms']:.3f} ms for {result['lookup_queries']:,} (slot, neighbour) "
        f"queries into {result['nnz']:,} entries ({result['table_mb']:.1f} MB); pairs found "
        f"{result.get('gc_found_eq3', float('nan')):.2f}")
  print(f"{result['layers']} layers x {result['embed']}, vocab {result['vocab']}, batch {result['batch']} x "
        f"{result['length']}, window ±{result['window']}, {result['dtype']} on {result['device']}")
  write_result(args.output, result)

if __name__ == "__main__":
  main()
