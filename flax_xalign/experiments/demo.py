"""The work of `xalign demo` (`make demo`): multilingual-e5-small aligning Greek and English words beside the
aligner users run (`e5_demo`), or the older from-scratch demo (`scratch_demo`); the command's docstring says
what each stage does.

Training and the masked-token evaluation go through gin, which only `cli/` may import: the command hands in
its trainer (`harness.Trainer`: `xalign train`) and evaluator (`Evaluator`: `xalign eval`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from collections.abc import Callable, Sequence
from typing import Any

from flax_xalign import fileio
from flax_xalign.errors import UserError, run_command
from flax_xalign.experiments import harness
from flax_xalign.experiments.harness import Trainer
from flax_xalign.run_dir import RunDir

METHODS = ("argmax", "itermax", "sinkhorn")
# `xalign eval` with these flags in this process: (its exit status, the masked-token results).
Evaluator = Callable[[Sequence[str]], tuple[int, Any]]


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


def _train(trainer: Trainer, gin_file: str, model_dir: str, steps: int | None, extra: Sequence[str] = ()) -> int:
  flags = [f"--gin_file={gin_file}", f"--gin.MODEL_DIR='{model_dir}'", *extra]
  if steps is not None:  # 0 is passed on, so that training refuses it instead of running the default.
    flags.append(f"--gin.TRAIN_STEPS={steps}")
  return trainer(flags)


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
  from flax_xalign.evaluation.word_alignment import statistical
  from flax_xalign.evaluation.word_alignment.bible_links import write_bible_links

  print("aligning every New Testament verse pair with eflomal (the statistical peer, and the labels SO learns "
        "from) ...", flush=True)
  result, splits = write_bible_links(links_dir)
  print(f"  eflomal {result.version}: {len(result.forward)} pairs in {result.seconds:.1f} s -> {links_dir}",
        flush=True)
  _, scored, sure = statistical.bible_corpus("test")
  assert scored == splits["test"]
  rows = statistical.score_directions(result, scored, sure)
  return {f"eflomal {result.version}": {name: rows[name].as_dict()
                                        for name in ("intersection", "grow-diag-final-and")}}


def e5_demo(trainer: Trainer, model_dir: str, align_steps: int | None, *, so_steps: int = DEMO_SO_STEPS,
            max_pairs: int | None = None) -> int:
  """The real encoder: import multilingual-e5-small, align it zero-shot, distil eflomal's links into it with
  SO for `so_steps`, and align again, beside eflomal and the diagonal; with `align_steps` also continue it
  with XLM-Align (the paper's setting)."""
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
    harness.import_e5(e5, trim_vocab_to="bible_grc_en_mlm_tlm", trim_normalize="nfd_strip_marks")
  peers = _eflomal_links_and_peer(links_dir) if so_steps else statistical_peer()
  runs = {"e5-small (zero-shot)": e5}
  if so_steps:
    print(f"\nflax_xalign demo 2/3: distil eflomal's links (train books) into e5-small with awesome-align's SO "
          f"objective at layer 7 for {so_steps} steps of 8 pairs -> {distilled}\n"
          "  (experiments/e5_so_eflomal.gin; ~2 s a step here. Run longer, 1,200 steps reached 31.0 test AER "
          "against eflomal's 34.2: docs/results/e5_so_eflomal.md)",
          flush=True)
    vocabulary = os.path.join(e5, "vocabulary.model")
    code = _train(trainer, "experiments/e5_so_eflomal.gin", distilled, so_steps, [
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
    code = _train(trainer, "experiments/e5_xlm_align.gin", aligned, align_steps,
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


@dataclasses.dataclass(frozen=True)
class DemoSettings:
  """The demo's flags (`model_dir` already given its default: runs/demo_e5 for e5, runs/demo for scratch)."""

  model_dir: str
  start: str = "e5"  # e5 or scratch.
  steps: int | None = None  # TRAIN_STEPS of demo.gin (scratch).
  align_steps: int | None = None  # TRAIN_STEPS of demo_xlm_align.gin (scratch); e5: of e5_xlm_align.gin.
  so_steps: int = DEMO_SO_STEPS  # e5: steps of SO on eflomal's links (0: none).
  max_pairs: int | None = None  # Fewer gold pairs (tests).
  fresh: bool = False  # Delete model_dir first (only a demo's: `check_model_dir`).


def check_model_dir(model_dir: str, *, fresh: bool) -> None:
  """--model_dir is new, empty or an earlier demo's; --fresh deletes only the latter (before any work)."""
  from flax_xalign.fileio import check_output_folder

  what = f"an earlier demo's (only {', '.join(DEMO_RUNS + DEMO_FILES)})"
  check_output_folder(model_dir, setting="--model_dir", owned=is_demo_dir, what=what)
  if fresh and os.path.isdir(model_dir) and os.listdir(model_dir):
    fileio.check_marked_by(model_dir, COMMAND)  # Its names alone do not prove it a demo's.
    shutil.rmtree(model_dir)


def e5_main(settings: DemoSettings, trainer: Trainer) -> int:
  """The default demo's flags checked, its folder marked, then `e5_demo`; its exit status."""
  if settings.steps is not None:
    raise UserError("--steps is the from-scratch demo's pretraining; with --start=e5 use --align_steps=N.")
  if settings.align_steps is not None and settings.align_steps < 0:
    raise UserError(f"--align_steps={settings.align_steps} must be >= 0 (0: no XLM-Align continuation).")
  if settings.so_steps < 0:
    raise UserError(f"--so_steps={settings.so_steps} must be >= 0 (0: no SO continuation).")
  fileio.mark_new_folder(settings.model_dir, COMMAND)  # Before its first file: a later --fresh may delete it.
  return e5_demo(trainer, settings.model_dir, settings.align_steps, so_steps=settings.so_steps,
                 max_pairs=settings.max_pairs)


def scratch_demo(settings: DemoSettings, *, trainer: Trainer, evaluate: Evaluator) -> int:
  """`--start=scratch`: a tiny encoder pretrained here, evaluated, continued with XLM-Align, both aligned
  against the gold beside eflomal; its exit status (a stage's own when it fails)."""
  from flax_xalign.evaluation.word_alignment import aer as aer_lib
  from flax_xalign.evaluation.word_alignment import report
  from flax_xalign.fileio import write_atomically

  start = time.time()
  cold = os.path.join(settings.model_dir, "cold")
  aligned = os.path.join(settings.model_dir, "xlm_align")
  fileio.mark_new_folder(settings.model_dir, COMMAND)  # Before its first file: a later --fresh may delete it.
  print(f"flax_xalign demo 1/3: cold start, MLM + TLM on Greek (SBLGNT) + English (BSB) -> {cold}", flush=True)
  code = _train(trainer, "experiments/demo.gin", cold, settings.steps)
  if code != 0:
    return code
  print("\nevaluating masked-token accuracy on the held-out test books ...", flush=True)
  code, mlm_results = evaluate([f"--gin.MODEL_DIR='{cold}'"])
  if code != 0:
    return code
  print(f"\nflax_xalign demo 2/3: XLM-Align (MLM + TLM + DWA) from the cold start -> {aligned}", flush=True)
  code = _train(trainer, "experiments/demo_xlm_align.gin", aligned, settings.align_steps,
                [f"--gin.INIT_FROM_CHECKPOINT='{cold}'"])
  if code != 0:
    return code
  print("\nflax_xalign demo 3/3: word alignment against the manual gold (test books) ...", flush=True)
  results = aer_comparison({"cold start": cold, "XLM-Align": aligned})
  peers = statistical_peer()
  write_atomically(os.path.join(settings.model_dir, "aer.json"),
                   json.dumps({**results, "peers": peers}, indent=2, default=str))
  table = report.layer_table(results)
  aer_lib.plot_layer_curve(table, os.path.join(settings.model_dir, "aer_layers.png"),
                           title="Greek-English AER per layer, held-out books")
  table = report.best_layer_table(results, show_aligner=False, peers=peers)
  print(_summarise(settings.model_dir, mlm_results, table, time.time() - start), flush=True)
  return 0


def run(settings: DemoSettings, *, trainer: Trainer, evaluate: Evaluator) -> int:
  """The demo's exit status: --model_dir checked (one `error:` line if refused), then the chosen demo."""
  code = run_command(lambda: check_model_dir(settings.model_dir, fresh=settings.fresh))
  if code:
    return code
  if settings.start == "e5":
    status = [0]  # A stage's own failure was printed by that stage; keep its exit status.
    return run_command(lambda: status.__setitem__(0, e5_main(settings, trainer))) or status[0]
  return scratch_demo(settings, trainer=trainer, evaluate=evaluate)
