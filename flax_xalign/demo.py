"""`make demo`: pretrain a tiny encoder on the embedded Bible corpus, then score it.

  python -m flax_xalign.demo [--model_dir=runs/demo] [--steps=N] [--fresh]

Runs the real entry points: `flax_xalign.train` with
gin_configs/experiments/demo.gin (MLM + TLM on bible_grc_en_mlm_tlm), then
`flax_xalign.eval` on the held-out test books, and prints a summary. Rerunning
resumes (or, when finished, only re-evaluates); --fresh starts over.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from typing import Sequence


def _summarise(model_dir: str, results: dict, seconds: float) -> str:
  from flax_xalign.evaluation.mlm_eval import format_table

  rows = [json.loads(line) for line in open(os.path.join(model_dir, "metrics.jsonl"))]
  train_rows = [r for r in rows if "tokens_per_sec" in r]
  tps = train_rows[-1]["tokens_per_sec"] if train_rows else float("nan")
  lines = [
      "",
      "=" * 72,
      format_table(results),
      "",
      f"  train throughput (last interval): {tps:,.0f} tokens/s",
      f"  wall time: {seconds / 60:.1f} min",
      f"  checkpoints:  {os.path.join(model_dir, 'checkpoints')}",
      f"  metrics:      {os.path.join(model_dir, 'metrics.jsonl')}",
      f"  TensorBoard:  tensorboard --logdir {os.path.join(model_dir, 'tensorboard')}",
      f"  eval results: {os.path.join(model_dir, 'eval.json')}",
      "=" * 72,
  ]
  return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model_dir", default="runs/demo")
  parser.add_argument("--steps", type=int, default=None, help="override TRAIN_STEPS of demo.gin")
  parser.add_argument("--fresh", action="store_true", help="delete model_dir first")
  args = parser.parse_args(argv)
  if args.fresh and os.path.isdir(args.model_dir):
    shutil.rmtree(args.model_dir)

  from flax_xalign import gin_cli
  from flax_xalign import train as train_main

  start = time.time()
  print(f"flax_xalign demo: MLM + TLM on Greek (SBLGNT) + English (BSB), model_dir={args.model_dir}",
        flush=True)
  flags = ["--gin_file=experiments/demo.gin", f"--gin.MODEL_DIR='{args.model_dir}'"]
  if args.steps:
    flags.append(f"--gin.TRAIN_STEPS={args.steps}")
  code = train_main.main(flags)
  if code != 0:
    return code
  print("\nevaluating on the held-out test books ...", flush=True)
  code, results = gin_cli.run([f"--gin.MODEL_DIR='{args.model_dir}'"], description="eval",
                              configurable="evaluate", default_gin_files=("runs/eval.gin",))
  if code != 0:
    return code
  print(_summarise(args.model_dir, results, time.time() - start), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
