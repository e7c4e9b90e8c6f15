"""The ALIGN-MLM study at laptop scale: objectives x synthetic languages.

  xalign align_mlm_grid --model_dir=runs/align_mlm \
      [--steps=N] [--transforms=trans,trans_inv] [--objectives=mlm,xlm,dict_mlm,align_mlm] \
      [--size=tiny|base] [--finetune_steps=N] [--tasks=pos,books] [--fresh]

For every transform (a derived language of the Greek NT) and objective, it
pretrains with the real entry point (`flax_xalign.train` with
gin_configs/experiments/align_mlm/<objective>.gin + <size>.gin) into
MODEL_DIR/<transform>/<objective>, reads the embedding alignment score (all
tokens, and tokens outside the training dictionary), then fine-tunes on the
natural language and on the derived language for each task and reports SUP,
ZS and Δ = SUP − ZS (Tang et al., Table 3). Tasks: Greek part-of-speech
tagging (SBLGNT gold tags) and verse classification by book group, on the
corpus' book-level splits.

Writes MODEL_DIR/results.json (one row per objective x transform, rewritten
after each row, so an interrupted grid resumes where it stopped),
results.md (the table) and alignment_vs_delta.png (alignment against Δ per
task, with Spearman's ρ over all rows).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Sequence

from flax_xalign.cli import common
from flax_xalign.cli import setup_process
from flax_xalign.cli.experiments import harness
from flax_xalign.errors import ArgumentParser, report
from flax_xalign.fileio import save_figure, write_atomically

OBJECTIVES = ("mlm", "xlm", "dict_mlm", "align_mlm")
DEFAULT_TRANSFORMS = ("trans", "trans_inv")
TASKS = ("pos", "books")
TASK_TITLES = {"pos": "POS", "books": "Book group"}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = ArgumentParser(prog="xalign align_mlm_grid", description=__doc__.splitlines()[0])
  parser.add_argument("--model_dir", required=True)
  parser.add_argument("--steps", type=int, default=None, help="pretraining steps (default: the size file's)")
  parser.add_argument("--transforms", default=",".join(DEFAULT_TRANSFORMS),
                      help="comma-separated derived languages, e.g. trans,trans_inv,inv")
  parser.add_argument("--objectives", default=",".join(OBJECTIVES))
  parser.add_argument("--size", default="tiny", help="size file in gin_configs/experiments/align_mlm/")
  parser.add_argument("--tasks", default=",".join(TASKS))
  parser.add_argument("--finetune_steps", type=int, default=150)
  parser.add_argument("--finetune_batch", type=int, default=32)
  parser.add_argument("--finetune_lr", type=float, default=1e-3)
  parser.add_argument("--gin", action="append", default=[], help="extra gin binding for every run, NAME=VALUE")
  parser.add_argument("--fresh", action="store_true", help="delete model_dir first")
  return parser.parse_args(argv)


def _split_list(text: str, known: Sequence[str] | None, what: str) -> list[str]:
  from flax_xalign.errors import UserError

  items = [x.strip() for x in text.split(",") if x.strip()]
  if not items:
    raise UserError(f"--{what} is empty.")
  if known is not None:
    unknown = [x for x in items if x not in known]
    if unknown:
      raise UserError(f"unknown {what} {unknown}; choose from {', '.join(known)}.")
  return items


def pretrain_run(run_dir: str, transform: str, objective: str, args: argparse.Namespace) -> int:
  from flax_xalign.cli import train as train_main

  mixture = f"synthetic_{transform}_{'xlm' if objective == 'xlm' else 'mlm'}"
  flags = [f"--gin_file=experiments/align_mlm/{objective}.gin",
           f"--gin_file=experiments/align_mlm/{args.size}.gin",
           f"--gin.MODEL_DIR='{run_dir}'", f"--gin.TRANSFORMS='{transform}'",
           f"--gin.MIXTURE_OR_TASK_NAME='{mixture}'"]
  if args.steps:
    flags.append(f"--gin.TRAIN_STEPS={args.steps}")
  flags += [f"--gin.{binding}" for binding in args.gin]
  return train_main.main(flags)


def task_data(name: str) -> tuple[list, list]:
  from flax_xalign.evaluation.transfer import transfer_data
  if name == "pos":
    return transfer_data.greek_pos("train"), transfer_data.greek_pos("test")
  return transfer_data.greek_verse_classification("train"), transfer_data.greek_verse_classification("test")


def evaluate_run(run_dir: str, transform: str, objective: str, tasks: Sequence[str],
                 data: dict, args: argparse.Namespace) -> dict[str, Any]:
  from flax_xalign.evaluation.transfer import transfer
  from flax_xalign.evaluation.alignment_score import run_alignment
  from flax_xalign.runs import Run
  from flax_xalign.tasks import synthetic as synthetic_tasks

  handle = Run.open(run_dir)
  run, step, params = handle.spec, handle.step, handle.params()
  loaded = (handle.model, params, run)  # Read once, fine-tuned from for every task.
  handle.register_tasks()
  language = synthetic_tasks.language_of(run.task)
  vocabulary = handle.vocabulary().base  # The natural SentencePiece model.
  alignment = run_alignment(handle, params) or {}
  row: dict[str, Any] = {
      "objective": objective, "transform": transform, "step": int(step), "model_dir": run_dir,
      "alignment": alignment.get("all"), "alignment_heldout": alignment.get("heldout"),
      "alignment_counts": {k: alignment.get(k) for k in ("count_all", "count_heldout")},
  }
  for task in tasks:
    train, test = data[task]
    result = transfer.zero_shot_transfer(
        loaded, vocabulary, task_name=task, train=train, test=test, language=language,
        natural_lang=synthetic_tasks.NATURAL, derived_lang=synthetic_tasks.derived_language_code(language),
        steps=args.finetune_steps, batch_size=args.finetune_batch, learning_rate=args.finetune_lr,
        seed=0, group_by_length=True, log=None)
    row[task] = {k: result[k] for k in ("metric", "sup", "zs", "delta", "natural", "seconds")}
  return row


def format_table(rows: Sequence[dict], tasks: Sequence[str]) -> str:
  """Markdown in the shape of the paper's Table 3 (scores in %)."""
  head = ["objective", "transform", "alignment", "alignment (held-out)"]
  for task in tasks:
    head += [f"{TASK_TITLES.get(task, task)} SUP", "ZS", "Δ"]
  lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]

  def pct(x):
    return "–" if x is None else f"{100 * x:.1f}"

  for row in rows:
    cells = [row["objective"], row["transform"], pct(row["alignment"]), pct(row["alignment_heldout"])]
    for task in tasks:
      r = row.get(task) or {}
      cells += [pct(r.get("sup")), pct(r.get("zs")), pct(r.get("delta"))]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def correlations(rows: Sequence[dict], tasks: Sequence[str]) -> dict[str, dict[str, float]]:
  """Spearman ρ (and two-sided p) between alignment and Δ over all rows, per task."""
  from scipy import stats

  out = {}
  for task in tasks:
    pairs = [(r["alignment"], r[task]["delta"]) for r in rows
             if r.get("alignment") is not None and task in r]
    if len(pairs) >= 3:
      rho, p = stats.spearmanr([a for a, _ in pairs], [d for _, d in pairs])
      out[task] = {"rho": float(rho), "p": float(p), "n": len(pairs)}
  return out


def plot(rows: Sequence[dict], tasks: Sequence[str], rhos: dict, path: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  from matplotlib import pyplot as plt

  fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 4), squeeze=False)
  markers = {t: m for t, m in zip(sorted({r["transform"] for r in rows}), "o^sDv")}
  try:
    for ax, task in zip(axes[0], tasks):
      for row in rows:
        if row.get("alignment") is None or task not in row:
          continue
        ax.scatter(100 * row["alignment"], 100 * row[task]["delta"], marker=markers[row["transform"]],
                   label=f"{row['objective']} / {row['transform']}")
      rho = rhos.get(task)
      title = TASK_TITLES.get(task, task) + (f"  (Spearman ρ = {rho['rho']:.2f})" if rho else "")
      ax.set_title(title)
      ax.set_xlabel("alignment (%)")
      ax.set_ylabel("Δ = SUP − ZS (points)")
      ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="best")
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
  finally:
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
  """The driver's exit status; SIGTERM and Ctrl-C stop it with one line (`common.run_driver`)."""
  return common.run_driver(_main, argv)


def _main(argv: Sequence[str] | None = None) -> int:
  from flax_xalign.errors import UserError

  setup_process()
  args = parse_args(argv)
  try:
    transforms = _split_list(args.transforms, None, "transforms")
    objectives = _split_list(args.objectives, OBJECTIVES, "objectives")
    tasks = _split_list(args.tasks, TASKS, "tasks")
    for transform in transforms:
      if "trans" not in transform.split("_"):
        raise UserError(f"transform {transform!r} has no transliteration ('trans'): the alignment score and "
                        "the dictionary objectives need the one-to-one token map it creates.")
    harness.prepare_driver_dir(args.model_dir, fresh=args.fresh)
  except UserError as e:
    return report(e)
  results_path = os.path.join(args.model_dir, "results.json")
  done = {}
  if os.path.exists(results_path):
    for row in json.load(open(results_path))["rows"]:
      done[(row["transform"], row["objective"])] = row
  start = time.time()
  data: dict = {}
  rows = []
  for transform in transforms:
    for objective in objectives:
      key = (transform, objective)
      if key in done and all(t in done[key] for t in tasks):
        rows.append(done[key])
        continue
      run_dir = os.path.join(args.model_dir, transform, objective)
      print(f"\n=== {objective} on {transform} -> {run_dir}", flush=True)
      t0 = time.time()
      code = pretrain_run(run_dir, transform, objective, args)
      if code != 0:
        return code
      pretrain_seconds = time.time() - t0
      for task in tasks:
        if task not in data:
          data[task] = task_data(task)
      row = evaluate_run(run_dir, transform, objective, tasks, data, args)
      row["pretrain_seconds"] = pretrain_seconds
      row["seconds"] = time.time() - t0
      summary = "  ".join(f"{t}: SUP {100 * row[t]['sup']:.1f} ZS {100 * row[t]['zs']:.1f} "
                          f"Δ {100 * row[t]['delta']:.1f}" for t in tasks)
      print(f"  alignment {100 * (row['alignment'] or 0):.1f}% (held-out "
            f"{100 * (row['alignment_heldout'] or 0):.1f}%)  {summary}  [{row['seconds']:.0f} s]", flush=True)
      rows.append(row)
      write_atomically(results_path, json.dumps({"rows": rows + [r for k, r in done.items() if r not in rows]}, indent=2))
  rhos = correlations(rows, tasks)
  table = format_table(rows, tasks)
  seconds = time.time() - start
  meta = {"rows": rows, "spearman_alignment_vs_delta": rhos, "tasks": list(tasks),
          "args": vars(args), "seconds": seconds}
  write_atomically(results_path, json.dumps(meta, indent=2))
  rho_text = "; ".join(f"{TASK_TITLES.get(t, t)}: ρ = {v['rho']:.2f} (p = {v['p']:.2g}, n = {v['n']})"
                       for t, v in rhos.items())
  write_atomically(os.path.join(args.model_dir, "results.md"),
         f"{table}\n\nSpearman correlation of alignment with Δ: {rho_text or 'n/a (fewer than 3 rows)'}\n")
  plot(rows, tasks, rhos, os.path.join(args.model_dir, "alignment_vs_delta.png"))
  print("\n" + table + f"\n\nSpearman alignment vs Δ: {rho_text or 'n/a'}\n"
        f"grid time this invocation: {seconds / 60:.1f} min; results in {args.model_dir}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
