"""The TCS-MLM / SCS-MLM miniature laboratory (Lu, Lu & Zhang 2023) at laptop scale.

  xalign code_switch --model_dir=runs/code_switch \
      [--settings=synthetic,natural] [--objectives=mlm,tcs,scs[,gc]] [--base_steps=N] [--steps=N] \
      [--natural_steps=N] [--e5_dir=runs/e5_bible] [--finetune_steps=150] [--max_sentences=N] [--fresh] \
      [--debian_data=runs/debian_data] [--debian_steps=N] [--seeds=2] [--debian_gold=DIR/{lang}-en.txt]

Three settings, each a starting "mono-mPLM" continued at the same budget with
MLM (the baseline), TCS-MLM and SCS-MLM through the real entry point
(`flax_xalign.train` + gin_configs/experiments/code_switch/*.gin):

* `synthetic` (ground truth): the Greek NT and its transliterated copy (token
  i <-> i + V, 10% of the pieces left shared as anchors) trained with MLM only
  from scratch for --base_steps (the mono-mPLM), then continued for --steps.
  The true dictionary is the token map, so Hit@k and RSIM are exact; POS
  tagging gives SUP / ZS / Δ through the transfer harness of the ALIGN-MLM
  grid (fine-tune on Greek, test on the transliterated copy).
* `debian` (also `natural`): multilingual-e5-small continued on the
  monolingual LibreOffice help text of every built language and English for
  --debian_steps, --seeds times per objective, MLM-GC (`gc`) beside the
  three by default; BLI / RSIM / MUSE cosine per language to English and
  sentence retrieval, before and after (`e5_debian`'s docstring says how).
* `bible`: multilingual-e5-small (imported offline, trimmed to the Bible's
  pieces: --e5_dir, imported there if missing) continued on the two
  monolingual Bible streams (Greek and English train books) for
  --natural_steps; BLI against the shipped Greek->English lexicon
  (flax_xalign/data/lexicons/grc-en.train.txt). (`natural` named this
  setting until the Debian data gave e5 eight natural languages.)

The synthetic and bible models (the starting ones included) are scored with
`xalign bli`'s machinery: Hit@1/5 of NN and CSLS at the
embedding layer between the two language-specific vocabularies (count >
--min_count), and RSIM and the mean cosine of translation pairs at every layer
(contextual states averaged over --max_sentences sentences per language).
Writes MODEL_DIR/results.json (rewritten after every row; a rerun skips
finished rows), results.md (the tables) and one rsim_<setting>.png per setting
(RSIM per layer and ΔRSIM against continued MLM: the paper's Fig. 7 shape).
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
from flax_xalign.run_dir import RunDir

SETTINGS = ("synthetic", "bible", "debian")
ALIASES = {"natural": "debian"}
OBJECTIVES = ("mlm", "tcs", "scs", "gc")
DEFAULT_OBJECTIVES = {"synthetic": ("mlm", "tcs", "scs"), "bible": ("mlm", "tcs", "scs"),
                      "debian": ("mlm", "tcs", "scs", "gc")}
NATURAL_LEXICON = "grc-en.train.txt"
NATURAL_NORMALIZE = "nfd_strip_marks"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = ArgumentParser(prog="xalign code_switch", description=__doc__.splitlines()[0])
  parser.add_argument("--model_dir", required=True)
  parser.add_argument("--settings", default="synthetic,natural", help=f"of {', '.join(SETTINGS)}; natural = debian")
  parser.add_argument("--objectives", default="", help="default: mlm,tcs,scs (debian: also gc)")
  parser.add_argument("--base_steps", type=int, default=5000, help="MLM steps of the synthetic mono-mPLM")
  parser.add_argument("--steps", type=int, default=600, help="continuation steps, synthetic setting")
  parser.add_argument("--natural_steps", type=int, default=100, help="continuation steps, bible setting")
  parser.add_argument("--base_dir", default=None, help="an existing synthetic mono-mPLM MODEL_DIR to start from")
  parser.add_argument("--e5_dir", default="runs/e5_bible", help="the imported, Bible-trimmed e5-small")
  parser.add_argument("--min_count", type=int, default=5, help="language-specific vocabularies: count > N")
  parser.add_argument("--max_sentences", type=int, default=1000, help="sentences per language for layers > 0")
  parser.add_argument("--finetune_steps", type=int, default=150)
  parser.add_argument("--gin", action="append", default=[], help="extra gin binding for every run, NAME=VALUE")
  parser.add_argument("--fresh", action="store_true", help="delete model_dir first")
  e5_debian.add_arguments(parser)
  return parser.parse_args(argv)


def _bli(run: Any, args: argparse.Namespace, **options: Any) -> dict[str, Any]:
  return harness.bli(run, layers="all", min_count=args.min_count, max_sentences=args.max_sentences,
                     **options)


def _top_half_rsim(curves: dict[str, list]) -> float:
  """Mean RSIM over the upper half of the encoder layers (layers > L/2, the embedding layer is 0)."""
  layers, values = curves["layers"], curves["rsim"]
  top = max(layers)
  upper = [v for layer, v in zip(layers, values) if layer > top / 2]
  return float(sum(upper) / len(upper))


def _row(setting: str, objective: str, model_dir: str, result: dict[str, Any], seconds: float) -> dict[str, Any]:
  curves = result["per_layer"]
  return {"setting": setting, "objective": objective, "model_dir": model_dir, "seconds": seconds,
          "nn": result["nn"], "csls": result["csls"], "coverage": result["coverage"], "pairs": result["pairs"],
          "vocab_sizes": result["vocab_sizes"], "per_layer": curves, "rsim_top_half": _top_half_rsim(curves),
          "mlm_accuracy": harness.mlm_accuracy(model_dir)}


def synthetic_rows(args: argparse.Namespace, objectives: Sequence[str], done: dict, save) -> list[dict]:
  root = os.path.join(args.model_dir, "synthetic")
  base = args.base_dir or os.path.join(root, "base")
  setting_gin = "experiments/code_switch/synthetic.gin"
  data: dict = {}
  rows = []
  print(f"\n=== synthetic: mono-mPLM (MLM, {args.base_steps} steps) -> {base}", flush=True)
  base_seconds = 0.0 if args.base_dir else harness.train(
      base, [setting_gin, "experiments/code_switch/mlm.gin"], args.gin, args.base_steps)
  runs = [("start", base, base_seconds)]
  for objective in objectives:
    run_dir = os.path.join(root, objective)
    if ("synthetic", objective) not in done:
      print(f"\n=== synthetic: {objective} continued for {args.steps} steps -> {run_dir}", flush=True)
    seconds = 0.0 if ("synthetic", objective) in done else harness.train(
        run_dir, [setting_gin, f"experiments/code_switch/{objective}.gin"],
        [f"train.init_from_checkpoint='{base}'", "OptimizerConfig.warmup_steps=50", *args.gin], args.steps)
    runs.append((objective, run_dir, seconds))
  from flax_xalign.runs import Run
  from flax_xalign.tasks import synthetic as synthetic_tasks

  derived = None
  for objective, run_dir, seconds in runs:
    key = ("synthetic", objective)
    if key in done:
      rows.append(done[key])
      continue
    run = Run.open(run_dir)  # Once: BLI and POS score the same step.
    if derived is None:
      derived = [code for code in run.spec.languages if code != synthetic_tasks.NATURAL][0]
    print(f"\n--- scoring synthetic / {objective} ({run_dir})", flush=True)
    result = _bli(run, args, src=synthetic_tasks.NATURAL, tgt=derived, gold="token_map")
    row = _row("synthetic", objective, run_dir, result, seconds)
    row["pos"] = harness.pos_transfer(run, finetune_steps=args.finetune_steps, cache=data)
    rows.append(row)
    save(row)
  return rows


def _ensure_e5(e5_dir: str) -> None:
  from flax_xalign.cli import e5_small

  if os.path.isdir(RunDir(e5_dir).checkpoints):
    return
  print(f"importing multilingual-e5-small, trimmed to the Bible's pieces -> {e5_dir}", flush=True)
  code = e5_small.main([f"--output={e5_dir}", "--trim_vocab_to=bible_grc_en_mlm_tlm",
                        f"--trim_normalize={NATURAL_NORMALIZE}"])
  harness.check_exit(code, f"importing e5-small into {e5_dir}")


def bible_rows(args: argparse.Namespace, objectives: Sequence[str], done: dict, save) -> list[dict]:
  from flax_xalign.data.sources import lexicon
  from flax_xalign.runs import Run
  root = os.path.join(args.model_dir, "bible")
  e5_dir = os.path.abspath(args.e5_dir)
  _ensure_e5(e5_dir)
  gold = str(lexicon.LEXICON_DIR / NATURAL_LEXICON)
  setting = ["experiments/code_switch/e5_bible.gin"]
  bindings = [f"train.init_from_checkpoint='{e5_dir}'",
              f"BibleTasks.vocabulary_path='{os.path.join(e5_dir, 'vocabulary.model')}'", *args.gin]
  runs = [("start", e5_dir, 0.0)]
  for objective in objectives:
    run_dir = os.path.join(root, objective)
    if ("bible", objective) not in done:
      print(f"\n=== bible: e5-small + {objective} for {args.natural_steps} steps -> {run_dir}", flush=True)
    seconds = 0.0 if ("bible", objective) in done else harness.train(
        run_dir, [os.path.join(e5_dir, "model.gin"), *setting, f"experiments/code_switch/{objective}.gin"],
        bindings, args.natural_steps)
    runs.append((objective, run_dir, seconds))
  rows = []
  for objective, run_dir, seconds in runs:
    key = ("bible", objective)
    if key in done:
      rows.append(done[key])
      continue
    print(f"\n--- scoring bible / {objective} ({run_dir})", flush=True)
    task = {"task": "bible", "normalize": NATURAL_NORMALIZE} if objective == "start" else {}
    result = _bli(Run.open(run_dir), args, src="grc", tgt="en", gold=gold, **task)
    row = _row("bible", objective, run_dir, result, seconds)
    rows.append(row)
    save(row)
  return rows


def format_table(rows: Sequence[dict]) -> str:
  head = ["setting", "model", "Hit@1 NN", "Hit@5 NN", "Hit@1 CSLS", "Hit@5 CSLS", "gold pairs",
          "RSIM (top half)", "POS SUP", "ZS", "Δ", "MLM acc"]
  lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---", "---"] + ["---:"] * (len(head) - 2)) + "|"]

  def pct(x):
    return "–" if x is None else f"{100 * x:.1f}"

  for row in rows:
    pos = row.get("pos") or {}
    name = "starting model" if row["objective"] == "start" else f"+ {row['objective'].upper()}"
    if row["objective"] == "mlm":
      name = "+ MLM (baseline)"
    cells = [row["setting"], name, pct(row["nn"]["hit@1"]), pct(row["nn"]["hit@5"]), pct(row["csls"]["hit@1"]),
             pct(row["csls"]["hit@5"]), f"{row['pairs']:,}", f"{row['rsim_top_half']:.3f}",
             pct(pos.get("sup")), pct(pos.get("zs")), pct(pos.get("delta")), pct(row.get("mlm_accuracy"))]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def plot(rows: Sequence[dict], setting: str, path: str) -> str | None:
  from flax_xalign.evaluation.lexicon import rsim
  curves = {r["objective"]: r["per_layer"]["rsim"] for r in rows if r["setting"] == setting}
  if "mlm" not in curves or len(curves) < 2:
    return None
  labels = {"start": "starting model", "mlm": "MLM", "tcs": "TCS-MLM", "scs": "SCS-MLM"}
  layers = next(r["per_layer"]["layers"] for r in rows if r["setting"] == setting)
  return rsim.plot_delta_rsim({labels[k]: v for k, v in curves.items()}, "MLM", path, layers=layers,
                              title=f"{setting}: RSIM per layer and ΔRSIM against continued MLM")


def _choices(args: argparse.Namespace) -> tuple[list[str], dict[str, list[str]]]:
  """(settings, {setting: objectives}); UserError for unknown names or gc outside the debian setting."""
  from flax_xalign.errors import UserError

  settings = harness.split_choices(args.settings, SETTINGS + tuple(ALIASES), "settings")
  settings = list(dict.fromkeys(ALIASES.get(s, s) for s in settings))
  asked = harness.split_choices(args.objectives, OBJECTIVES, "objectives") if args.objectives else None
  chosen = {s: list(asked or DEFAULT_OBJECTIVES[s]) for s in settings}
  for setting, objectives in chosen.items():
    if setting != "debian" and "gc" in objectives:
      raise UserError(f"--objectives=gc runs in the debian setting only; the {setting} MLM-GC runs are "
                      "`xalign mlm_gc`.")
  return settings, chosen


def main(argv: Sequence[str] | None = None) -> int:
  """The driver's exit status; SIGTERM and Ctrl-C stop it with one line (`common.run_driver`)."""
  return common.run_driver(_main, argv)


def _main(argv: Sequence[str] | None = None) -> int:
  from flax_xalign.errors import UserError

  setup_process()
  args = parse_args(argv)
  try:
    settings, objectives = _choices(args)
    if "debian" in settings:
      e5_debian.check_args(args)
    results = harness.Results(args.model_dir, args, fresh=args.fresh)
    done, save = results.done, results.save
    rows: list[dict] = []
    if "synthetic" in settings:
      rows += synthetic_rows(args, objectives["synthetic"], done, save)
    if "bible" in settings:
      rows += bible_rows(args, objectives["bible"], done, save)
    if "debian" in settings:
      rows += e5_debian.rows(args, objectives["debian"], results)
  except UserError as e:
    return report(e)
  debian = [r for r in rows if r["setting"] == "debian"]
  others = [r for r in rows if r["setting"] != "debian"]
  tables = ([format_table(others)] if others else []) + (
      [e5_debian_report.format_table(debian), e5_debian_report.format_languages(debian)] if debian else [])
  table = "\n\n".join(tables)
  plots = [p for s in settings if s != "debian" and (p := plot(rows, s, os.path.join(args.model_dir, f"rsim_{s}.png")))]
  if debian and (p := e5_debian_report.plot(debian, os.path.join(args.model_dir, "rsim_debian.png"),
                                            title=f"e5-small continued {args.debian_steps} steps on the help text")):
    plots.append(p)
  seconds = results.finish(rows, table)
  print("\n" + table + f"\n\nplots: {', '.join(plots) or 'none'}; wall time {seconds / 60:.1f} min; results in "
        f"{args.model_dir}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
