"""Cost of XLM-Align's DWA: train-step time of MLM+TLM+DWA over MLM+TLM.

Both sides are the exact `flax_xalign.training.trainer.Trainer` step (masking,
encoder, MLM/TLM logits at the masked slots, AdamW, jit with donated state) on
the same batches of translation pairs laid out as the feature converter does
(`<s> a </s> <s> b </s>`, positions restarting per side). The DWA side adds the
no-grad self-labelling forward, the similarity, Sinkhorn, Itermax and the
pointer network. Rounds alternate the two sides; medians are compared.

The expected overhead is one extra forward pass (about a third of a train
step's FLOPs) plus the [batch, length, length] alignment work; the target is a
ratio <= 1.5.

  python bench/dwa_overhead.py            # tiny preset, 16 x 128 (about a minute)
  python bench/dwa_overhead.py --size=small --rounds=5
  python bench/dwa_overhead.py --data=bible  # the demo's real packed batches

The last printed line is one JSON object (also written to
bench/results/dwa_overhead.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from typing import Any

import numpy as np
from train_step_side import Side

_RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "dwa_overhead.json")
_BOS, _EOS, _FIRST_REGULAR = 3, 1, 5


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--size", default="tiny", help="encoder preset: tiny, small, base, large")
  parser.add_argument("--vocab", type=int, default=8000)
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--length", type=int, default=128)
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--steps", type=int, default=5, help="timed steps per side per round")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--data", default="pairs", choices=("pairs", "bible"),
                      help="pairs: synthetic rows of one translation pair each; bible: the demo's real "
                           "packed batches of bible_grc_en_mlm_tlm (~60%% monolingual examples)")
  parser.add_argument("--output", default=_RESULTS)
  return parser.parse_args(argv)


def pair_batches(rng: np.random.Generator, *, count: int, batch: int, length: int, vocab: int) -> list[dict]:
  """Rows holding one translation pair each, sides of random length."""
  out = []
  for _ in range(count):
    feats = {k: np.zeros((batch, length), np.int32)
             for k in ("tokens", "lang_ids", "segment_ids", "positions", "pair_side")}
    for r in range(batch):
      budget = length - 4
      n = int(rng.integers(budget // 3, budget // 2 + 1))
      m = int(rng.integers(budget // 3, budget - n + 1))
      a = rng.integers(_FIRST_REGULAR, vocab, n)
      b = rng.integers(_FIRST_REGULAR, vocab, m)
      row = np.concatenate([[_BOS], a, [_EOS], [_BOS], b, [_EOS]])
      span = len(row)
      feats["tokens"][r, :span] = row
      feats["lang_ids"][r, :span] = [1] * (n + 2) + [2] * (m + 2)
      feats["segment_ids"][r, :span] = 1
      feats["positions"][r, :span] = np.concatenate([np.arange(n + 2), np.arange(m + 2)])
      feats["pair_side"][r, :span] = [1] * (n + 2) + [2] * (m + 2)
    out.append(feats)
  return out


def bible_batches(*, count: int, batch: int, length: int, seed: int) -> tuple[list[dict], int]:
  """The demo's batches (the real packed mixture) and its vocabulary size."""
  from flax_xalign.training.data import resolve_task

  data = resolve_task("bible_grc_en_mlm_tlm")
  ds = data.dataset(feature_lengths={"tokens": length}, batch_size=batch, seed=seed)
  return [dict(b) for _, b in zip(range(count), ds.as_numpy_iterator())], data.vocabulary_spec.size


def build_trainer(objectives: dict[str, float], args: argparse.Namespace) -> Any:
  from flax_xalign.models import config as model_config
  from flax_xalign.models.encoder import Encoder
  from flax_xalign.objectives.model import PretrainingModel
  from flax_xalign.training import partitioning
  from flax_xalign.training.optimizer import OptimizerConfig
  from flax_xalign.training.trainer import LoopConfig, Trainer

  preset = getattr(model_config, args.size.upper())
  encoder = preset.replace(vocab_size=args.vocab, num_languages=2, dropout_rate=0.0,
                           attention_dropout_rate=0.0, pointer_head="dwa" in objectives)
  model = PretrainingModel(encoder=Encoder(encoder), objectives=objectives)
  loop = LoopConfig(train_steps=1000, batch_size=args.batch, length=args.length, seed=args.seed)
  partitioner = partitioning.Partitioner(mesh=partitioning.make_mesh(1), rules=partitioning.logical_axis_rules())
  return Trainer(model=model, optimizer=OptimizerConfig(), partitioner=partitioner, loop=loop)


def run(args: argparse.Namespace) -> dict[str, Any]:
  import jax

  if args.data == "bible":
    batches, args.vocab = bible_batches(count=4, batch=args.batch, length=args.length, seed=args.seed)
  else:
    batches = pair_batches(np.random.default_rng(args.seed), count=4, batch=args.batch,
                           length=args.length, vocab=args.vocab)
  sides = [Side(name, build_trainer(objectives, args), batches)
           for name, objectives in (("MLM+TLM", {"mlm": 1.0, "tlm": 1.0}),
                                    ("MLM+TLM+DWA", {"mlm": 1.0, "tlm": 1.0, "dwa": 1.0}))]
  times: dict[str, list[float]] = {s.name: [] for s in sides}
  for r in range(args.rounds):
    for side in sides:
      times[side.name].append(side.timed(args.steps))
    print(f"round {r + 1}/{args.rounds}: " + "  ".join(f"{k} {v[-1] * 1e3:.1f} ms" for k, v in times.items()),
          flush=True)
  base, dwa = (statistics.median(times[s.name]) for s in sides)
  labels = float(jax.device_get(sides[1].last_metrics["dwa_labels"]))
  return {
      "benchmark": "dwa_overhead", "data": args.data,
      "size": args.size, "batch": args.batch, "length": args.length, "vocab": args.vocab,
      "mlm_tlm_ms": base * 1e3, "mlm_tlm_dwa_ms": dwa * 1e3,
      "ratio": dwa / base, "target_ratio_max": 1.5,
      "dwa_labels_per_batch": labels,
      "rounds": args.rounds, "steps": args.steps,
      "backend": jax.default_backend(), "devices": jax.device_count(),
  }


def main(argv: list[str] | None = None) -> None:
  args = parse_args(argv)
  result = run(args)
  print()
  print(f"{'configuration':<16}{'ms / step':>12}")
  print(f"{'MLM+TLM':<16}{result['mlm_tlm_ms']:>12.1f}")
  print(f"{'MLM+TLM+DWA':<16}{result['mlm_tlm_dwa_ms']:>12.1f}")
  verdict = "met" if result["ratio"] <= result["target_ratio_max"] else "NOT met"
  print(f"DWA step / base step = {result['ratio']:.2f}x (target <= 1.5x: {verdict}); "
        f"{result['dwa_labels_per_batch']:.0f} self-labelled links per batch")
  os.makedirs(os.path.dirname(args.output), exist_ok=True)
  from flax_xalign import fileio

  fileio.write_atomically(args.output, json.dumps(result, indent=2))
  print(json.dumps(result))


if __name__ == "__main__":
  main()
