"""The MLM-GC miniature laboratory (Ai & Fang 2023) at laptop scale (`xalign mlm_gc`).

Each setting trains three encoders FROM SCRATCH at the same budget through
the real entry point (the trainer the command hands in: `xalign train` +
gin_configs/experiments/mlm_gc/): MLM (the baseline), MLM-GC with Eq. 3 and
MLM-GC with Eq. 6; `trans`, `trans_inv` (ground truth: the token map),
`natural` (the Bible's Greek and English streams, the shipped lexicon) and
`debian` (multilingual-e5-small continued on the Debian help text, `e5_debian`).
The command's docstring says more.

Every model but the Debian ones is scored with `xalign bli`'s machinery (the
MUSE cosine beside shuffled pairs, the analogy accuracy, Hit@1 of NN and CSLS,
the pair cosine per layer) and its last held-out MLM accuracy. Writes
MODEL_DIR/results.json (rewritten after every row; a rerun skips finished
rows), results.md and pair_cosine.png.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Sequence

from flax_xalign.experiments import e5_debian, e5_debian_report, harness

SETTINGS = ("trans", "trans_inv", "natural", "debian")
OBJECTIVES = ("mlm", "gc", "gc_output")
LABELS = {"mlm": "MLM", "gc": "MLM-GC (Eq. 3)", "gc_output": "MLM-GC (Eq. 6)"}
NATURAL_LEXICON = "grc-en.train.txt"


@dataclasses.dataclass(frozen=True)
class MlmGcSettings(e5_debian.DebianFlags):
  """The driver's settings: the command's flags, in their order (results.json records them as `args`); the
  `debian_*` / `seeds` fields are `e5_debian.DebianFlags`'."""

  model_dir: str
  settings: str = ",".join(SETTINGS)
  objectives: str = ",".join(OBJECTIVES)
  steps: int = 1500  # Training steps of every run.
  min_count: int = 5  # Language-specific vocabularies: count > N.
  max_sentences: int = 500  # Sentences per language for layers > 0.
  finetune_steps: int = 150  # POS fine-tuning steps (synthetic).
  gin: Sequence[str] = ()  # Extra gin bindings for every run, NAME=VALUE.
  fresh: bool = False  # Delete model_dir first.


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


def setting_rows(trainer: harness.Trainer, setting: str, settings: MlmGcSettings, objectives: Sequence[str],
                 done: dict, save, cache: dict) -> list[dict]:
  from flax_xalign.runs import Run

  files, bindings = _setting_gin(setting)
  runs = []
  for objective in objectives:
    run_dir = os.path.join(settings.model_dir, setting, objective)
    seconds = 0.0
    if (setting, objective) not in done:
      print(f"\n=== {setting}: {LABELS[objective]} from scratch, {settings.steps} steps -> {run_dir}", flush=True)
      seconds = harness.train(trainer, run_dir, [*files, f"experiments/mlm_gc/{objective}.gin"],
                              [*bindings, *settings.gin], settings.steps)
    runs.append((objective, run_dir, seconds))
  rows = []
  for objective, run_dir, seconds in runs:
    if (setting, objective) in done:
      rows.append(done[(setting, objective)])
      continue
    print(f"\n--- scoring {setting} / {LABELS[objective]} ({run_dir})", flush=True)
    run = Run.open(run_dir)  # Once: BLI and POS score the same step.
    result = harness.bli(run, layers="all", isomorphism=True, min_count=settings.min_count,
                         max_sentences=settings.max_sentences, **_gold(setting, run))
    row = _row(setting, objective, run_dir, result, seconds)
    if setting != "natural":
      row["pos"] = harness.pos_transfer(run, finetune_steps=settings.finetune_steps, cache=cache)
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
             pct(_get(row, "nn", "hit@1")), pct(_get(row, "csls", "hit@1")),
             "–" if row.get("pairs") is None else f"{row['pairs']:,}",
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


def run(settings: MlmGcSettings, *, trainer: harness.Trainer) -> int:
  """Every chosen setting trained through `trainer` and scored (finished rows kept), then the tables and
  plots written and printed; 0 (a refusal is a UserError before any work)."""
  chosen = harness.split_choices(settings.settings, SETTINGS, "settings")
  objectives = harness.split_choices(settings.objectives, OBJECTIVES, "objectives")
  debian_setting = e5_debian.DebianSetting.of(settings)
  if "debian" in chosen:
    e5_debian.check_args(debian_setting)
  results = harness.Results(settings.model_dir, settings, fresh=settings.fresh)
  rows: list[dict] = []
  cache: dict = {}
  for setting in chosen:
    if setting == "debian":
      rows += e5_debian.rows(trainer, debian_setting, objectives, results)
    else:
      rows += setting_rows(trainer, setting, settings, objectives, results.done, results.save, cache)
  # Rows of earlier invocations (other settings) stay in the files, in a fixed order.
  kept = {**results.kept, **{harness.row_key(r): r for r in rows}}
  debian = [r for r in kept.values() if r["setting"] == "debian"]
  rows = sorted((r for r in kept.values() if r["setting"] != "debian"),
                key=lambda r: (SETTINGS.index(r["setting"]), OBJECTIVES.index(r["objective"])))
  tables = ([format_table(rows)] if rows else []) + (
      [e5_debian_report.format_table(debian), e5_debian_report.format_languages(debian)] if debian else [])
  table = "\n\n".join(tables)
  figures = [plot(rows, os.path.join(settings.model_dir, "pair_cosine.png")) if rows else None,
             e5_debian_report.plot(debian, os.path.join(settings.model_dir, "rsim_debian.png")) if debian else None]
  seconds = results.finish([*rows, *debian], table)
  print("\n" + table + f"\n\nplots: {', '.join(f for f in figures if f) or 'none'}; wall time "
        f"{seconds / 60:.1f} min; results in {settings.model_dir}", flush=True)
  return 0
