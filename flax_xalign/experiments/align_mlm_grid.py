"""The ALIGN-MLM study at laptop scale (`xalign align_mlm_grid`): objectives x synthetic languages.

For every transform (a derived language of the Greek NT) and objective, it
pretrains with the real entry point (`xalign train` with
gin_configs/experiments/align_mlm/<objective>.gin + <size>.gin, through the
trainer the command hands in) into MODEL_DIR/<transform>/<objective>, reads
the embedding alignment score (all tokens, and tokens outside the training
dictionary), then fine-tunes on the natural language and on the derived
language for each task and reports SUP, ZS and Δ = SUP − ZS (Tang et al.,
Table 3). Tasks: Greek part-of-speech tagging (SBLGNT gold tags) and verse
classification by book group, on the corpus' book-level splits.

Writes MODEL_DIR/results.json (one row per objective x transform, rewritten
after each row, so an interrupted grid resumes where it stopped),
results.md (the table) and alignment_vs_delta.png (alignment against Δ per
task, with Spearman's ρ over all rows).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, Sequence

from flax_xalign.experiments import harness
from flax_xalign.fileio import save_figure, write_atomically

OBJECTIVES = ("mlm", "xlm", "dict_mlm", "align_mlm")
DEFAULT_TRANSFORMS = ("trans", "trans_inv")
TASKS = ("pos", "books")
TASK_TITLES = {"pos": "POS", "books": "Book group"}


@dataclasses.dataclass(frozen=True)
class GridSettings:
  """The grid's settings: the command's flags, in their order (results.json records them as `args`)."""

  model_dir: str
  steps: int | None = None  # Pretraining steps (None: the size file's).
  transforms: str = ",".join(DEFAULT_TRANSFORMS)  # Comma-separated derived languages, e.g. trans,trans_inv,inv.
  objectives: str = ",".join(OBJECTIVES)
  size: str = "tiny"  # A size file in gin_configs/experiments/align_mlm/.
  tasks: str = ",".join(TASKS)
  finetune_steps: int = 150
  finetune_batch: int = 32
  finetune_lr: float = 1e-3
  gin: Sequence[str] = ()  # Extra gin bindings for every run, NAME=VALUE.
  fresh: bool = False  # Delete model_dir first.


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


def pretrain_run(trainer: harness.Trainer, run_dir: str, transform: str, objective: str,
                 settings: GridSettings) -> int:
  mixture = f"synthetic_{transform}_{'xlm' if objective == 'xlm' else 'mlm'}"
  flags = [f"--gin_file=experiments/align_mlm/{objective}.gin",
           f"--gin_file=experiments/align_mlm/{settings.size}.gin",
           f"--gin.MODEL_DIR='{run_dir}'", f"--gin.TRANSFORMS='{transform}'",
           f"--gin.MIXTURE_OR_TASK_NAME='{mixture}'"]
  if settings.steps:
    flags.append(f"--gin.TRAIN_STEPS={settings.steps}")
  flags += [f"--gin.{binding}" for binding in settings.gin]
  return trainer(flags)


def task_data(name: str) -> tuple[list, list]:
  from flax_xalign.evaluation.transfer import transfer_data
  if name == "pos":
    return transfer_data.greek_pos("train"), transfer_data.greek_pos("test")
  return transfer_data.greek_verse_classification("train"), transfer_data.greek_verse_classification("test")


def evaluate_run(run_dir: str, transform: str, objective: str, tasks: Sequence[str],
                 data: dict, settings: GridSettings) -> dict[str, Any]:
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
        steps=settings.finetune_steps, batch_size=settings.finetune_batch, learning_rate=settings.finetune_lr,
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


def check(settings: GridSettings) -> tuple[list[str], list[str], list[str]]:
  """(transforms, objectives, tasks), and MODEL_DIR made ready; UserError before any work for a bad name."""
  from flax_xalign.errors import UserError

  transforms = _split_list(settings.transforms, None, "transforms")
  objectives = _split_list(settings.objectives, OBJECTIVES, "objectives")
  tasks = _split_list(settings.tasks, TASKS, "tasks")
  for transform in transforms:
    if "trans" not in transform.split("_"):
      raise UserError(f"transform {transform!r} has no transliteration ('trans'): the alignment score and "
                      "the dictionary objectives need the one-to-one token map it creates.")
  harness.prepare_driver_dir(settings.model_dir, fresh=settings.fresh)
  return transforms, objectives, tasks


def _grid_rows(settings: GridSettings, trainer: harness.Trainer, transforms: Sequence[str],
               objectives: Sequence[str], tasks: Sequence[str], results_path: str) -> tuple[list[dict], int]:
  """(the rows, 0) after training and scoring every cell not done; ([], training's status) if it failed."""
  done = {}
  if os.path.exists(results_path):
    for row in json.load(open(results_path))["rows"]:
      done[(row["transform"], row["objective"])] = row
  data: dict = {}
  rows = []
  for transform in transforms:
    for objective in objectives:
      key = (transform, objective)
      if key in done and all(t in done[key] for t in tasks):
        rows.append(done[key])
        continue
      run_dir = os.path.join(settings.model_dir, transform, objective)
      print(f"\n=== {objective} on {transform} -> {run_dir}", flush=True)
      t0 = time.time()
      code = pretrain_run(trainer, run_dir, transform, objective, settings)
      if code != 0:
        return [], code
      pretrain_seconds = time.time() - t0
      for task in tasks:
        if task not in data:
          data[task] = task_data(task)
      row = evaluate_run(run_dir, transform, objective, tasks, data, settings)
      row["pretrain_seconds"] = pretrain_seconds
      row["seconds"] = time.time() - t0
      summary = "  ".join(f"{t}: SUP {100 * row[t]['sup']:.1f} ZS {100 * row[t]['zs']:.1f} "
                          f"Δ {100 * row[t]['delta']:.1f}" for t in tasks)
      print(f"  alignment {100 * (row['alignment'] or 0):.1f}% (held-out "
            f"{100 * (row['alignment_heldout'] or 0):.1f}%)  {summary}  [{row['seconds']:.0f} s]", flush=True)
      rows.append(row)
      write_atomically(results_path,
                       json.dumps({"rows": rows + [r for k, r in done.items() if r not in rows]}, indent=2))
  return rows, 0


def run(settings: GridSettings, *, trainer: harness.Trainer) -> int:
  """The grid: every cell trained through `trainer` and scored, then the table, ρ and the plot written and
  printed; the exit status (a failed training's own, after its output)."""
  transforms, objectives, tasks = check(settings)
  results_path = os.path.join(settings.model_dir, "results.json")
  start = time.time()
  rows, code = _grid_rows(settings, trainer, transforms, objectives, tasks, results_path)
  if code != 0:
    return code
  rhos = correlations(rows, tasks)
  table = format_table(rows, tasks)
  seconds = time.time() - start
  meta = {"rows": rows, "spearman_alignment_vs_delta": rhos, "tasks": list(tasks),
          "args": vars(settings), "seconds": seconds}
  write_atomically(results_path, json.dumps(meta, indent=2))
  rho_text = "; ".join(f"{TASK_TITLES.get(t, t)}: ρ = {v['rho']:.2f} (p = {v['p']:.2g}, n = {v['n']})"
                       for t, v in rhos.items())
  write_atomically(os.path.join(settings.model_dir, "results.md"),
         f"{table}\n\nSpearman correlation of alignment with Δ: {rho_text or 'n/a (fewer than 3 rows)'}\n")
  plot(rows, tasks, rhos, os.path.join(settings.model_dir, "alignment_vs_delta.png"))
  print("\n" + table + f"\n\nSpearman alignment vs Δ: {rho_text or 'n/a'}\n"
        f"grid time this invocation: {seconds / 60:.1f} min; results in {settings.model_dir}", flush=True)
  return 0
