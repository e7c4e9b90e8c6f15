"""`make demo`: pretrain a tiny encoder on the embedded Bible corpus, then XLM-Align it.

  python -m flax_xalign.demo [--model_dir=runs/demo] [--steps=N] [--align_steps=N] [--fresh]
  python -m flax_xalign.demo --start=e5 [--model_dir=runs/demo_e5] [--align_steps=N]

Runs the real entry points, in three stages:
1. cold start: `flax_xalign.train` with gin_configs/experiments/demo.gin (MLM +
   TLM on bible_grc_en_mlm_tlm) into MODEL_DIR/cold, then `flax_xalign.eval`
   (masked-token accuracy on the held-out test books);
2. XLM-Align: continued pretraining with MLM + TLM + denoising word alignment
   (experiments/demo_xlm_align.gin) into MODEL_DIR/xlm_align;
3. word alignment of the held-out books' Greek-English verses against the
   manual gold alignments, for both models, every layer and the three
   extraction methods (argmax, itermax, Sinkhorn): a table in the shape of the
   paper's Table 2, beside the statistical aligner users would pick instead
   (eflomal, every NT verse pair, unsupervised) and the diagonal reference,
   and per-layer AER curves (MODEL_DIR/aer_layers.png).
Rerunning resumes (or, when finished, only re-evaluates); --fresh starts over.

`--start=e5` is the paper's setting instead: multilingual-e5-small imported
offline (trimmed to the Bible's pieces), continued with MLM + TLM + DWA
(experiments/e5_xlm_align.gin), and both aligned against the same gold, eflomal
and the diagonal. On 2 CPU cores a continuation step of this 12-layer model
takes ~5 s, so the default budget is small; see the README for measured numbers.
(`python -m flax_xalign.cli.demo` is the same command.)
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Sequence

from flax_xalign.cli import setup_process
from flax_xalign.errors import ArgumentParser
from flax_xalign.run_dir import RunDir

METHODS = ("argmax", "itermax", "sinkhorn")


def _throughput(model_dir: str) -> float:
  rows = [json.loads(line) for line in open(RunDir(model_dir).metrics)]
  train_rows = [r for r in rows if "tokens_per_sec" in r]
  return train_rows[-1]["tokens_per_sec"] if train_rows else float("nan")


def _summarise(model_dir: str, mlm_results: dict, aer_table: str, seconds: float) -> str:
  from flax_xalign.evaluation.mlm_eval import format_table

  cold, aligned = (os.path.join(model_dir, name) for name in ("cold", "xlm_align"))
  lines = [
      "",
      "=" * 72,
      "Masked-token accuracy of the cold-start model (held-out test books):",
      format_table(mlm_results),
      "",
      "Word alignment, Greek -> English, held-out test books (AER %, lower is better):",
      aer_table,
      "",
      f"  train throughput (last interval): cold start {_throughput(cold):,.0f} tokens/s, "
      f"XLM-Align {_throughput(aligned):,.0f} tokens/s",
      f"  wall time: {seconds / 60:.1f} min",
      f"  runs:         {cold}  {aligned}",
      f"  AER per layer: {os.path.join(model_dir, 'aer_layers.png')}, {os.path.join(model_dir, 'aer.json')}",
      f"  TensorBoard:  tensorboard --logdir {model_dir}",
      "=" * 72,
  ]
  return "\n".join(lines)


def _train(gin_file: str, model_dir: str, steps: int | None, extra: Sequence[str] = ()) -> int:
  from flax_xalign.cli import train as train_main

  flags = [f"--gin_file={gin_file}", f"--gin.MODEL_DIR='{model_dir}'", *extra]
  if steps is not None:  # 0 is passed on, so that training refuses it instead of running the default.
    flags.append(f"--gin.TRAIN_STEPS={steps}")
  return train_main.main(flags)


def aer_comparison(runs: dict, *, split: str = "test", max_pairs: int | None = None) -> dict:
  """Per-layer AER of each run and method on the Bible gold alignments."""
  from flax_xalign.evaluation.word_alignment import word_align
  return {name: word_align.evaluate_alignment(model_dir, split=split, methods=METHODS, max_pairs=max_pairs,
                                             verbose=False)
          for name, model_dir in runs.items()}


def statistical_peer(split: str = "test") -> dict:
  """eflomal's AER on the same gold, as users run it (every NT pair, unsupervised); {} if not installed."""
  from flax_xalign.evaluation.word_alignment import statistical
  version = statistical.eflomal_version()
  if version is None:
    print(f"(eflomal is not installed, so its row is left out: {statistical.INSTALL_HINT})", flush=True)
    return {}
  print(f"aligning every New Testament verse pair with eflomal {version} (the statistical peer) ...", flush=True)
  rows, result, size = statistical.score_eflomal(split)
  print(f"  eflomal: {size} pairs in {result.seconds:.1f} s", flush=True)
  keep = ("intersection", "grow-diag-final-and")
  return {f"eflomal {version}": {name: rows[name].as_dict() for name in keep}}


E5_ALIGNER = {"encoding": "separate", "normalize": "nfd_strip_marks"}


def e5_demo(model_dir: str, align_steps: int | None) -> int:
  """The paper's setting: import multilingual-e5-small, align zero-shot, continue with XLM-Align, align again."""
  from flax_xalign.cli import e5_small
  from flax_xalign.evaluation.word_alignment import aer as aer_lib
  from flax_xalign.evaluation.word_alignment import report
  from flax_xalign.evaluation.word_alignment import word_align
  from flax_xalign.fileio import write_atomically

  start = time.time()
  e5, aligned = os.path.join(model_dir, "e5"), os.path.join(model_dir, "xlm_align")
  if not os.path.isdir(e5):
    print(f"flax_xalign demo (e5) 1/3: import multilingual-e5-small, trimmed to the Bible's pieces -> {e5}",
          flush=True)
    code = e5_small.main([f"--output={e5}", "--trim_vocab_to=bible_grc_en_mlm_tlm",
                          "--trim_normalize=nfd_strip_marks"])
    if code != 0:
      return code
  print(f"\nflax_xalign demo (e5) 2/3: XLM-Align (MLM + TLM + DWA) continued from e5-small -> {aligned}\n"
        "  (experiments/e5_xlm_align.gin: 6,000 steps, ~8 h on 2 CPU cores, ~2 min on a GPU; --align_steps=N "
        "shortens it, but under ~3,000 steps AER got worse than zero-shot in our runs)", flush=True)
  code = _train("experiments/e5_xlm_align.gin", aligned, align_steps,
                [f"--gin_file={os.path.join(e5, 'model.gin')}", f"--gin.INIT_FROM_CHECKPOINT='{e5}'",
                 f"--gin.BibleTasks.vocabulary_path='{os.path.join(e5, 'vocabulary.model')}'"])
  if code != 0:
    return code
  print("\nflax_xalign demo (e5) 3/3: word alignment against the manual gold (test books), each side "
        "encoded alone, cosine, Greek diacritics stripped ...", flush=True)
  results = {name: word_align.evaluate_alignment(path, split="test", methods=METHODS, similarity="cosine",
                                                 verbose=False, **E5_ALIGNER)
             for name, path in (("e5-small", e5), ("e5-small + XLM-Align", aligned))}
  peers = statistical_peer()
  write_atomically(os.path.join(model_dir, "aer.json"),
                   json.dumps({**results, "peers": peers}, indent=2, default=str))
  aer_lib.plot_layer_curve(report.layer_table(results), os.path.join(model_dir, "aer_layers.png"),
                           title="Greek-English AER per layer, held-out books")
  lines = ["", "=" * 72, "Word alignment, Greek -> English, held-out test books (AER %, lower is better):",
           report.best_layer_table(results, show_aligner=False, peers=peers), "",
           f"  XLM-Align throughput (last interval): {_throughput(aligned):,.0f} tokens/s",
           f"  wall time: {(time.time() - start) / 60:.1f} min",
           f"  AER per layer: {os.path.join(model_dir, 'aer_layers.png')}, {os.path.join(model_dir, 'aer.json')}",
           "=" * 72]
  print("\n".join(lines), flush=True)
  return 0


def main(argv: Sequence[str] | None = None) -> int:
  setup_process()
  parser = ArgumentParser(prog="python -m flax_xalign.demo", description=__doc__.splitlines()[0])
  parser.add_argument("--model_dir", default="runs/demo")
  parser.add_argument("--start", default="scratch", choices=("scratch", "e5"),
                      help="scratch: pretrain a tiny encoder, then XLM-Align it (default); e5: continue the "
                           "imported multilingual-e5-small with XLM-Align, as the paper continues XLM-R")
  parser.add_argument("--steps", type=int, default=None, help="override TRAIN_STEPS of demo.gin")
  parser.add_argument("--align_steps", type=int, default=None,
                      help="override TRAIN_STEPS of demo_xlm_align.gin (e5_xlm_align.gin with --start=e5)")
  parser.add_argument("--fresh", action="store_true", help="delete model_dir first")
  args = parser.parse_args(argv)
  if args.fresh and os.path.isdir(args.model_dir):
    shutil.rmtree(args.model_dir)
  if args.start == "e5":
    return e5_demo(args.model_dir, args.align_steps)

  from flax_xalign import gin_cli
  from flax_xalign.evaluation.word_alignment import aer as aer_lib
  from flax_xalign.evaluation.word_alignment import report
  from flax_xalign.fileio import write_atomically

  start = time.time()
  cold = os.path.join(args.model_dir, "cold")
  aligned = os.path.join(args.model_dir, "xlm_align")
  print(f"flax_xalign demo 1/3: cold start, MLM + TLM on Greek (SBLGNT) + English (BSB) -> {cold}", flush=True)
  code = _train("experiments/demo.gin", cold, args.steps)
  if code != 0:
    return code
  print("\nevaluating masked-token accuracy on the held-out test books ...", flush=True)
  code, mlm_results = gin_cli.run([f"--gin.MODEL_DIR='{cold}'"], description="eval",
                                  configurable="evaluate", default_gin_files=("runs/eval.gin",))
  if code != 0:
    return code
  print(f"\nflax_xalign demo 2/3: XLM-Align (MLM + TLM + DWA) from the cold start -> {aligned}", flush=True)
  code = _train("experiments/demo_xlm_align.gin", aligned, args.align_steps,
                [f"--gin.INIT_FROM_CHECKPOINT='{cold}'"])
  if code != 0:
    return code
  print("\nflax_xalign demo 3/3: word alignment against the manual gold (test books) ...", flush=True)
  results = aer_comparison({"cold start": cold, "XLM-Align": aligned})
  peers = statistical_peer()
  write_atomically(os.path.join(args.model_dir, "aer.json"),
                   json.dumps({**results, "peers": peers}, indent=2, default=str))
  table = report.layer_table(results)
  aer_lib.plot_layer_curve(table, os.path.join(args.model_dir, "aer_layers.png"),
                           title="Greek-English AER per layer, held-out books")
  table = report.best_layer_table(results, show_aligner=False, peers=peers)
  print(_summarise(args.model_dir, mlm_results, table, time.time() - start), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
