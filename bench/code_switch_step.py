"""Step cost of TCS-MLM and SCS-MLM over MLM at the same batch.

All three sides are the exact `flax_xalign.training.trainer.Trainer` step
(masking, encoder, MLM logits at the masked slots, AdamW, jit with donated
state, assets passed as step arguments) on the same batches of packed
monolingual rows of two languages. TCS adds the dictionary lookups and a
second forward/backward pass; SCS adds the first pass's MLM logits at the
switch slots, the top-k averages, the on-the-fly CSLS between the slots and
the batch's candidates, and the second pass on mixed input embeddings. Rounds
alternate the sides (the first step of a side in a round is a warm-up, not
timed); medians are compared.

Two passes are inherent, so the step costs about twice MLM's; the targets are
TCS <= 2.1x and SCS <= 2.3x. A fourth side, SCS with candidates='vocabulary'
(CSLS over each language's whole language-specific vocabulary instead of the
batch's tokens, Eq. 5-7 as written), measures what that reading costs; it has
no target.

  python bench/code_switch_step.py                      # 4 layers x 256, batch 16 x 128
  python bench/code_switch_step.py --layers=12 --embed=768 --heads=12 --vocab=30000
  python bench/code_switch_step.py --quick              # seconds: a smoke run

The assets are synthetic: language A uses ids [5, 5 + n), language B the next
n ids, a few ids are shared; the language-specific vocabularies are the two
ranges and the dictionary maps i <-> i + n. The last printed line is one JSON
object (also written to bench/results/code_switch_step.json).
"""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Any

import numpy as np
from train_step_side import Side, print_ratio_table, write_result  # pylint: disable=import-error

_RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "code_switch_step.json")
_BOS, _EOS, _FIRST_REGULAR = 3, 1, 5
_TARGETS = {"tcs": 2.1, "scs": 2.3}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--layers", type=int, default=4)
  parser.add_argument("--embed", type=int, default=256)
  parser.add_argument("--heads", type=int, default=4)
  parser.add_argument("--mlp", type=int, default=1024)
  parser.add_argument("--vocab", type=int, default=8000)
  parser.add_argument("--shared", type=float, default=0.05,
                      help="share of regular ids used by both languages")
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
    args.layers, args.embed, args.heads, args.mlp, args.vocab = 2, 32, 2, 64, 301
    args.batch, args.length, args.rounds, args.steps = 4, 32, 2, 2
  return args


def language_ranges(vocab: int, shared: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(ids of language A only, ids of language B only (= A + n), shared ids)."""
  regular = vocab - _FIRST_REGULAR
  n_shared = int(regular * shared)
  n = (regular - n_shared) // 2
  a = np.arange(_FIRST_REGULAR, _FIRST_REGULAR + n)
  return a, a + n, np.arange(_FIRST_REGULAR + 2 * n, _FIRST_REGULAR + 2 * n + n_shared)


def batches(rng: np.random.Generator, *, count: int, batch: int, length: int, vocab: int,
            shared: float) -> list[dict]:
  """Rows of packed monolingual sentences (language 1 on even rows, 2 on odd ones), padding at the end."""
  a, b, common = language_ranges(vocab, shared)
  out = []
  for _ in range(count):
    feats = {k: np.zeros((batch, length), np.int32)
             for k in ("tokens", "lang_ids", "segment_ids", "positions", "pair_side")}
    for r in range(batch):
      own = np.concatenate([a if r % 2 == 0 else b, common])
      cursor, segment = 0, 1
      while cursor < length - 8:
        n = int(rng.integers(6, 40))
        sentence = np.concatenate([[_BOS], own[rng.zipf(1.3, n) % len(own)], [_EOS]])[:length - cursor]
        span = slice(cursor, cursor + len(sentence))
        feats["tokens"][r, span] = sentence
        feats["lang_ids"][r, span] = 1 + r % 2
        feats["segment_ids"][r, span] = segment
        feats["positions"][r, span] = np.arange(len(sentence))
        cursor += len(sentence)
        segment += 1
    out.append(feats)
  return out


def asset_values(vocab: int, shared: float) -> dict[str, dict[str, np.ndarray]]:
  a, b, _ = language_ranges(vocab, shared)
  ids = np.stack([a, b]).astype(np.int32)
  mask = np.ones(ids.shape, bool)
  lang_ids = np.asarray([1, 2], np.int32)
  return {
      "lang_vocab": {"ids": ids, "mask": mask, "counts": np.full(ids.shape, 1000, np.int32),
                     "lang_ids": lang_ids},
      "induced_dictionary": {"vocab_ids": ids, "vocab_mask": mask, "translation": ids[::-1].copy(),
                             "score": np.full(ids.shape, 0.5, np.float32), "lang_ids": lang_ids},
  }


def build_trainer(objectives: dict[str, float], args: argparse.Namespace, options: dict | None = None) -> Any:

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
  model = PretrainingModel(encoder=Encoder(encoder), objectives=objectives, objective_options=options or {})
  needed = set(model.requires())
  values = {name: v for name, v in asset_values(args.vocab, args.shared).items() if name in needed}
  assets = RunAssets.of_values(values)
  loop = LoopConfig(train_steps=1000, batch_size=args.batch, length=args.length, seed=args.seed)
  partitioner = partitioning.Partitioner(mesh=partitioning.make_mesh(1),
                                         rules=partitioning.logical_axis_rules())
  return Trainer(model=model, optimizer=OptimizerConfig(), partitioner=partitioner, loop=loop, assets=assets)


def run(args: argparse.Namespace) -> dict[str, Any]:
  import jax

  data = batches(np.random.default_rng(args.seed), count=4, batch=args.batch, length=args.length,
                 vocab=args.vocab, shared=args.shared)
  sides = [Side(name, build_trainer(objectives, args, options), data)
           for name, objectives, options in (
               ("MLM", {"mlm": 1.0}, None), ("MLM+TCS", {"mlm": 1.0, "tcs": 1.0}, None),
               ("MLM+SCS", {"mlm": 1.0, "scs": 1.0}, None),
               ("MLM+SCS vocab", {"mlm": 1.0, "scs": 1.0}, {"scs": {"candidates": "vocabulary"}}))]
  times: dict[str, list[float]] = {s.name: [] for s in sides}
  for r in range(args.rounds):
    for side in sides:
      times[side.name].append(side.timed(args.steps))
    print(f"round {r + 1}/{args.rounds}: " + "  ".join(f"{k} {v[-1] * 1e3:.1f} ms" for k, v in times.items()),
          flush=True)
  mlm, tcs, scs, scs_vocab = (statistics.median(times[s.name]) for s in sides)
  best = [min(times[s.name]) for s in sides]
  flops = [side.flops() for side in sides]
  flops_ratio = {name: (flops[i] / flops[0] if flops[0] and flops[i] else None)
                 for i, name in ((1, "tcs"), (2, "scs"))}
  metrics = {key: float(jax.device_get(side.last_metrics[key])) for side in sides[1:3]
             for key in side.last_metrics if key.startswith(("tcs_", "scs_"))}
  vocab_candidates = float(jax.device_get(sides[3].last_metrics["scs_candidates"]))
  return {
      "benchmark": "code_switch_step",
      "layers": args.layers, "embed": args.embed, "heads": args.heads, "mlp": args.mlp, "vocab": args.vocab,
      "batch": args.batch, "length": args.length, "dtype": args.dtype,
      "mlm_ms": mlm * 1e3, "tcs_ms": tcs * 1e3, "scs_ms": scs * 1e3,
      "ratio_tcs": tcs / mlm, "ratio_scs": scs / mlm, "ratio": max(tcs, scs) / mlm,
      "scs_vocabulary_ms": scs_vocab * 1e3, "ratio_scs_vocabulary": scs_vocab / mlm,
      "scs_candidates_batch": metrics.get("scs_candidates"), "scs_candidates_vocabulary": vocab_candidates,
      # Fastest round of each side: less sensitive to other load on the machine than the median.
      "ratio_tcs_best": best[1] / best[0], "ratio_scs_best": best[2] / best[0],
      "flops_ratio_tcs": flops_ratio["tcs"], "flops_ratio_scs": flops_ratio["scs"],
      "target_ratio_tcs": _TARGETS["tcs"], "target_ratio_scs": _TARGETS["scs"],
      "switched_share_tcs": metrics.get("tcs_switched"), "switched_share_scs": metrics.get("scs_switched"),
      "rounds": args.rounds, "steps": args.steps,
      "backend": jax.default_backend(), "device": jax.devices()[0].device_kind, "devices": jax.device_count(),
  }


def main(argv: list[str] | None = None) -> None:
  args = parse_args(argv)
  result = run(args)
  print_ratio_table(result["mlm_ms"], [("MLM+" + name.upper(), result[f"{name}_ms"], result[f"ratio_{name}"],
                                        _TARGETS[name]) for name in ("tcs", "scs")])
  if result["flops_ratio_tcs"] is not None:
    print(f"XLA cost-analysis FLOPs over MLM: TCS {result['flops_ratio_tcs']:.2f}x, "
          f"SCS {result['flops_ratio_scs']:.2f}x; fastest rounds: TCS {result['ratio_tcs_best']:.2f}x, "
          f"SCS {result['ratio_scs_best']:.2f}x")
  print(f"SCS candidates='vocabulary': {result['scs_vocabulary_ms']:.1f} ms, {result['ratio_scs_vocabulary']:.2f}x "
        f"MLM ({result['scs_candidates_vocabulary']:,.0f} candidates over both sides vs "
        f"{result['scs_candidates_batch']:,.0f} from the batch)")
  print(f"{result['layers']} layers x {result['embed']}, vocab {result['vocab']}, batch {result['batch']} x "
        f"{result['length']}, {result['dtype']} on {result['device']}")
  write_result(args.output, result)

if __name__ == "__main__":
  main()
