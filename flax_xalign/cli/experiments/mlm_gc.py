"""The MLM-GC miniature laboratory (Ai & Fang 2023) at laptop scale.

  xalign mlm_gc --model_dir=runs/mlm_gc \
      [--settings=trans,trans_inv,natural,debian] [--objectives=mlm,gc,gc_output] [--steps=N] \
      [--finetune_steps=150] [--max_sentences=N] [--fresh] [--debian_data=runs/debian_data] [--debian_steps=N] \
      [--seeds=2]

Each setting trains three encoders FROM SCRATCH at the same budget through
the real entry point (`flax_xalign.train` + gin_configs/experiments/mlm_gc/):
MLM (the baseline), MLM-GC with Eq. 3 (hidden states of the masked token and
its neighbours) and MLM-GC with Eq. 6 (the neighbours' output embeddings).
The GC runs count their co-occurrence table over the run's task when they
start (the `cooc` asset: window 2, distance weights 1/(d+1), c_lang).

* `trans`, `trans_inv` (ground truth): the Greek NT and its transliterated
  (and, for trans_inv, also inverted) copy; the true dictionary is the token
  map i <-> i + V, so the gold-pair cosine and Hit@k are exact, and POS tagging
  gives SUP / ZS / Δ (fine-tune on Greek, test on the copy).
* `natural`: the Bible's Greek and English monolingual streams under the
  Bible's own vocabulary; gold = the shipped Greek->English lexicon
  (flax_xalign/data/lexicons/grc-en.train.txt).

* `debian`: not from scratch: multilingual-e5-small continued on the
  monolingual LibreOffice help text of every built language and English for
  --debian_steps, --seeds times per objective, scored before and after with
  BLI / RSIM / MUSE cosine per language to English and sentence retrieval
  (the setting the TCS/SCS driver shares: `e5_debian`'s docstring says how).

Every other model is scored with `xalign bli`'s machinery: the gold
translation pairs' mean cosine at the embedding layer ("MUSE cosine", Table 2;
a multi-piece word is the mean of its pieces) next to the mean cosine of
shuffled pairs, the cross-lingual analogy accuracy, Hit@1 of NN and CSLS, the
mean pair cosine per layer, and the run's last held-out MLM accuracy (GC must
not hurt MLM). Writes MODEL_DIR/results.json (rewritten after every row; a
rerun skips finished rows), results.md and pair_cosine.png.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Sequence

from flax_xalign.cli import common
from flax_xalign.cli import setup_process
from flax_xalign.cli.experiments import e5_debian, e5_debian_report, harness
from flax_xalign.errors import ArgumentParser, report

SETTINGS = ("trans", "trans_inv", "natural", "debian")
OBJECTIVES = ("mlm", "gc", "gc_output")
LABELS = {"mlm": "MLM", "gc": "MLM-GC (Eq. 3)", "gc_output": "MLM-GC (Eq. 6)"}
NATURAL_LEXICON = "grc-en.train.txt"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = ArgumentParser(prog="xalign mlm_gc", description=__doc__.splitlines()[0])
  parser.add_argument("--model_dir", required=True)
  parser.add_argument("--settings", default=",".join(SETTINGS))
  parser.add_argument("--objectives", default=",".join(OBJECTIVES))
  parser.add_argument("--steps", type=int, default=1500, help="training steps of every run")
  parser.add_argument("--min_count", type=int, default=5, help="language-specific vocabularies: count > N")
  parser.add_argument("--max_sentences", type=int, default=500, help="sentences per language for layers > 0")
  parser.add_argument("--finetune_steps", type=int, default=150, help="POS fine-tuning steps (synthetic)")
  parser.add_argument("--gin", action="append", default=[], help="extra gin binding for every run, NAME=VALUE")
  parser.add_argument("--fresh", action="store_true", help="delete model_dir first")
  e5_debian.add_arguments(parser)
  return parser.parse_args(argv)


def _setting_gin(setting: str) -> tuple[list[str], list[str]]:
  """(gin files, bindings) of a setting."""
  if setting == "natural":
    return ["experiments/mlm_gc/natural.gin"], []
  return ["experiments/mlm_gc/synthetic.gin"], [f"TRANSFORMS='{setting}'",
                                                f"MIXTURE_OR_TASK_NAME='synthetic_{setting}_mlm'"]


def _gold(setting: str, run: Any) -> dict[str, str]:
  """The bli options naming a setting's languages and gold dictionary."""
  if setting == "natural":
    from flax_xalign.data.sources import lexicon
    path = os.path.join(os.path.dirname(lexicon.__file__), "lexicons", NATURAL_LEXICON)
    return {"src": "grc", "tgt": "en", "gold": path}
  from flax_xalign.tasks import synthetic as synthetic_tasks

  derived = [c for c in run.spec.languages if c != synthetic_tasks.NATURAL][0]
  return {"src": synthetic_tasks.NATURAL, "tgt": derived, "gold": "token_map"}


def _row(setting: str, objective: str, run_dir: str, result: dict[str, Any], seconds: float) -> dict[str, Any]:
  keep = ("nn", "csls", "coverage", "pairs", "vocab_sizes", "per_layer", "muse_cosine", "analogy")
  seconds = seconds or harness.logged_train_seconds(run_dir) or 0.0
  return {"setting": setting, "objective": objective, "model_dir": run_dir, "seconds": seconds,
          **{k: result.get(k) for k in keep}, "mlm_accuracy": harness.mlm_accuracy(run_dir)}


def setting_rows(setting: str, args: argparse.Namespace, objectives: Sequence[str], done: dict, save,
                 cache: dict) -> list[dict]:
  from flax_xalign.runs import Run

  files, bindings = _setting_gin(setting)
  runs = []
  for objective in objectives:
    run_dir = os.path.join(args.model_dir, setting, objective)
    seconds = 0.0
    if (setting, objective) not in done:
      print(f"\n=== {setting}: {LABELS[objective]} from scratch, {args.steps} steps -> {run_dir}", flush=True)
      seconds = harness.train(run_dir, [*files, f"experiments/mlm_gc/{objective}.gin"], [*bindings, *args.gin],
                              args.steps)
    runs.append((objective, run_dir, seconds))
  rows = []
  for objective, run_dir, seconds in runs:
    if (setting, objective) in done:
      rows.append(done[(setting, objective)])
      continue
    print(f"\n--- scoring {setting} / {LABELS[objective]} ({run_dir})", flush=True)
    run = Run.open(run_dir)  # Once: BLI and POS score the same step.
    result = harness.bli(run, layers="all", isomorphism=True, min_count=args.min_count,
                         max_sentences=args.max_sentences, **_gold(setting, run))
    row = _row(setting, objective, run_dir, result, seconds)
    if setting != "natural":
      row["pos"] = harness.pos_transfer(run, finetune_steps=args.finetune_steps, cache=cache)
    rows.append(row)
    save(row)
  return rows


def _get(row: dict, *path: str) -> Any:
  value: Any = row
  for key in path:
    if not isinstance(value, dict) or key not in value:
      return None
    value = value[key]
  return value


def format_table(rows: Sequence[dict]) -> str:
  head = ["setting", "model", "gold-pair cos", "shuffled-pair cos", "analogy acc", "Hit@1 NN", "Hit@1 CSLS",
          "gold pairs", "POS SUP", "ZS", "Δ", "MLM acc", "train min"]
  lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---", "---"] + ["---:"] * (len(head) - 2)) + "|"]

  def pct(x):
    return "–" if x is None else f"{100 * x:.1f}"

  def num(x):
    return "–" if x is None else f"{x:.3f}"

  for row in rows:
    pos = row.get("pos") or {}
    cells = [row["setting"], LABELS[row["objective"]], num(_get(row, "muse_cosine", "mean")),
             num(_get(row, "muse_cosine", "shuffled_mean")), pct(_get(row, "analogy", "accuracy")),
             pct(_get(row, "nn", "hit@1")), pct(_get(row, "csls", "hit@1")), "–" if row.get("pairs") is None else f"{row['pairs']:,}",
             pct(pos.get("sup")), pct(pos.get("zs")), pct(pos.get("delta")), pct(row.get("mlm_accuracy")),
             f"{row['seconds'] / 60:.1f}"]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def plot(rows: Sequence[dict], path: str) -> str | None:
  """Gold-pair minus shuffled-pair mean cosine per layer, one panel per setting, one line per model.

  The raw gold-pair cosine mostly measures how anisotropic a layer is (shuffled pairs score high too,
  e.g. 0.85 at e5-small's top layer); the gap is what translation adds.
  """
  try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    return None
  def curve(row):
    per_layer = _get(row, "muse_cosine", "per_layer")
    if not per_layer:
      return None
    return per_layer["layers"], [g - s for g, s in zip(per_layer["mean"], per_layer["shuffled_mean"])]

  settings = [s for s in SETTINGS if any(r["setting"] == s and curve(r) for r in rows)]
  if not settings:
    return None
  fig, axes = plt.subplots(1, len(settings), figsize=(4.2 * len(settings), 3.4), squeeze=False)
  for ax, setting in zip(axes[0], settings):
    for row in (r for r in rows if r["setting"] == setting and curve(r)):
      layers, gap = curve(row)
      ax.plot(layers, gap, marker="o", label=LABELS[row["objective"]])
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.set_title(setting)
    ax.set_xlabel("layer (0 = embeddings)")
    ax.set_ylabel("gold-pair cos − shuffled-pair cos")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  fig.suptitle("MLM vs MLM-GC: cross-lingual isomorphism per layer")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def main(argv: Sequence[str] | None = None) -> int:
  """The driver's exit status; SIGTERM and Ctrl-C stop it with one line (`common.run_driver`)."""
  return common.run_driver(_main, argv)


def _main(argv: Sequence[str] | None = None) -> int:
  from flax_xalign.errors import UserError

  setup_process()
  args = parse_args(argv)
  try:
    settings = harness.split_choices(args.settings, SETTINGS, "settings")
    objectives = harness.split_choices(args.objectives, OBJECTIVES, "objectives")
    if "debian" in settings:
      e5_debian.check_args(args)
    results = harness.Results(args.model_dir, args, fresh=args.fresh)
    rows: list[dict] = []
    cache: dict = {}
    for setting in settings:
      if setting == "debian":
        rows += e5_debian.rows(args, objectives, results)
      else:
        rows += setting_rows(setting, args, objectives, results.done, results.save, cache)
  except UserError as e:
    return report(e)
  # Rows of earlier invocations (other settings) stay in the files, in a fixed order.
  kept = {**results.kept, **{harness.row_key(r): r for r in rows}}
  debian = [r for r in kept.values() if r["setting"] == "debian"]
  rows = sorted((r for r in kept.values() if r["setting"] != "debian"),
                key=lambda r: (SETTINGS.index(r["setting"]), OBJECTIVES.index(r["objective"])))
  tables = ([format_table(rows)] if rows else []) + (
      [e5_debian_report.format_table(debian), e5_debian_report.format_languages(debian)] if debian else [])
  table = "\n\n".join(tables)
  figures = [plot(rows, os.path.join(args.model_dir, "pair_cosine.png")) if rows else None,
             e5_debian_report.plot(debian, os.path.join(args.model_dir, "rsim_debian.png")) if debian else None]
  seconds = results.finish([*rows, *debian], table)
  print("\n" + table + f"\n\nplots: {', '.join(f for f in figures if f) or 'none'}; wall time "
        f"{seconds / 60:.1f} min; results in {args.model_dir}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
