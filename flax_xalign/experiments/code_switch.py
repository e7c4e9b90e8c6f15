"""The TCS-MLM / SCS-MLM miniature laboratory (Lu, Lu & Zhang 2023) at laptop scale (`xalign code_switch`).

Three settings, each a starting model (a true mono-mPLM only in `synthetic`: e5-small was trained on
text pairs, translations among them) continued at the same budget with
MLM (the baseline), TCS-MLM and SCS-MLM through the real entry point (the
trainer the command hands in: `xalign train` + gin_configs/experiments/code_switch/*.gin):
`synthetic` (the Greek NT and its transliterated copy, a mono-mPLM trained
here first; exact gold, POS SUP / ZS / Δ), `debian` (alias `natural`:
multilingual-e5-small on the Debian help text, `e5_debian`) and `bible`
(multilingual-e5-small on the two monolingual Bible streams, BLI against the
shipped Greek->English lexicon). The command's docstring says more.

The synthetic and bible models (the starting ones included) are scored with
`xalign bli`'s machinery (Hit@1/5 of NN and CSLS at the embedding layer; RSIM
and the pair cosine at every layer). Writes MODEL_DIR/results.json (rewritten
after every row; a rerun skips finished rows), results.md (the tables) and one
rsim_<setting>.png per setting (the paper's Fig. 7 shape).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Sequence

from flax_xalign.experiments import e5_debian, e5_debian_report, harness
from flax_xalign.run_dir import RunDir

SETTINGS = ("synthetic", "bible", "debian")
ALIASES = {"natural": "debian"}
OBJECTIVES = ("mlm", "tcs", "scs", "gc", "tcs_gold")  # tcs_gold: the control of tcs_gold.gin (synthetic only).
DEFAULT_OBJECTIVES = {"synthetic": ("mlm", "tcs", "scs"), "bible": ("mlm", "tcs", "scs"),
                      "debian": ("mlm", "tcs", "scs", "gc")}
NATURAL_LEXICON = "grc-en.train.txt"
NATURAL_NORMALIZE = "nfd_strip_marks"


@dataclasses.dataclass(frozen=True)
class CodeSwitchSettings(e5_debian.DebianFlags):
  """The driver's settings: the command's flags, in their order (results.json records them as `args`); the
  `debian_*` / `seeds` fields are `e5_debian.DebianFlags`'."""

  model_dir: str
  settings: str = "synthetic,natural"  # Of SETTINGS (+ ALIASES).
  objectives: str = ""  # Empty: DEFAULT_OBJECTIVES.
  base_steps: int = 5000  # MLM steps of the synthetic mono-mPLM.
  steps: int = 600  # Continuation steps, synthetic setting.
  natural_steps: int = 100  # Continuation steps, bible setting.
  base_dir: str | None = None  # An existing synthetic mono-mPLM MODEL_DIR to start from.
  e5_dir: str = "runs/e5_bible"  # The imported, Bible-trimmed e5-small.
  min_count: int = 5  # Language-specific vocabularies: count > N.
  max_sentences: int = 1000  # Sentences per language for layers > 0.
  finetune_steps: int = 150
  gin: Sequence[str] = ()  # Extra gin bindings for every run, NAME=VALUE.
  fresh: bool = False  # Delete model_dir first.


def _bli(run: Any, settings: CodeSwitchSettings, **options: Any) -> dict[str, Any]:
  return harness.bli(run, layers="all", min_count=settings.min_count, max_sentences=settings.max_sentences,
                     **options)


def top_half_mean(curves: dict[str, list], key: str = "rsim") -> float:
  """Mean of the per-layer curve `key` (RSIM by default) over the upper half of the encoder layers (layers > L/2,
  the embedding layer is 0)."""
  layers, values = curves["layers"], curves[key]
  top = max(layers)
  upper = [v for layer, v in zip(layers, values) if layer > top / 2]
  return float(sum(upper) / len(upper))


def _row(setting: str, objective: str, model_dir: str, result: dict[str, Any], seconds: float) -> dict[str, Any]:
  curves = result["per_layer"]
  return {"setting": setting, "objective": objective, "model_dir": model_dir, "seconds": seconds,
          "nn": result["nn"], "csls": result["csls"], "coverage": result["coverage"], "pairs": result["pairs"],
          "vocab_sizes": result["vocab_sizes"], "per_layer": curves, "rsim_top_half": top_half_mean(curves),
          "mlm_accuracy": harness.mlm_accuracy(model_dir)}


def dictionary_hit1(run: Any) -> float | None:
  """Hit@1 of the dictionary a TCS run switched with, natural -> derived, against the true token map: of the
  natural language-specific tokens whose counterpart is in the derived vocabulary, the share translated to
  it (None for a run without an `induced_dictionary`)."""
  import numpy as np

  from flax_xalign.tasks import synthetic as synthetic_tasks

  if "induced_dictionary" not in run.spec.assets:
    return None
  value = run.assets(("induced_dictionary",))["induced_dictionary"]
  id_map = np.asarray(synthetic_tasks.language_of(run.spec.task).id_map())
  ids, mask, translation = (np.asarray(value[k]) for k in ("vocab_ids", "vocab_mask", "translation"))
  src, out = ids[0][mask[0]], translation[0][mask[0]]
  keep = np.isin(id_map[src], ids[1][mask[1]])
  return float(np.mean(out[keep] == id_map[src][keep])) if keep.any() else None


def synthetic_rows(trainer: harness.Trainer, settings: CodeSwitchSettings, objectives: Sequence[str], done: dict,
                   save) -> list[dict]:
  root = os.path.join(settings.model_dir, "synthetic")
  base = settings.base_dir or os.path.join(root, "base")
  setting_gin = "experiments/code_switch/synthetic.gin"
  data: dict = {}
  rows = []
  print(f"\n=== synthetic: the mono-mPLM {base} (given, not trained here)" if settings.base_dir else
        f"\n=== synthetic: mono-mPLM (MLM, {settings.base_steps} steps) -> {base}", flush=True)
  base_seconds = 0.0 if settings.base_dir else harness.train(
      trainer, base, [setting_gin, "experiments/code_switch/mlm.gin"], settings.gin, settings.base_steps)
  runs = [("start", base, base_seconds)]
  for objective in objectives:
    run_dir = os.path.join(root, objective)
    if ("synthetic", objective) not in done:
      print(f"\n=== synthetic: {objective} continued for {settings.steps} steps -> {run_dir}", flush=True)
    seconds = 0.0 if ("synthetic", objective) in done else harness.train(
        trainer, run_dir, [setting_gin, f"experiments/code_switch/{objective}.gin"],
        [f"train.init_from_checkpoint='{base}'", "OptimizerConfig.warmup_steps=50", *settings.gin], settings.steps)
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
    result = _bli(run, settings, src=synthetic_tasks.NATURAL, tgt=derived, gold="token_map")
    row = _row("synthetic", objective, run_dir, result, seconds)
    row["pos"] = harness.pos_transfer(run, finetune_steps=settings.finetune_steps, cache=data)
    row["dictionary_hit1"] = dictionary_hit1(run)
    rows.append(row)
    save(row)
  return rows


def _ensure_e5(e5_dir: str) -> None:
  if os.path.isdir(RunDir(e5_dir).checkpoints):
    return
  print(f"importing multilingual-e5-small, trimmed to the Bible's pieces -> {e5_dir}", flush=True)
  harness.import_e5(e5_dir, trim_vocab_to="bible_grc_en_mlm_tlm", trim_normalize=NATURAL_NORMALIZE)


def bible_rows(trainer: harness.Trainer, settings: CodeSwitchSettings, objectives: Sequence[str], done: dict,
               save) -> list[dict]:
  from flax_xalign.data.sources import lexicon
  from flax_xalign.runs import Run
  root = os.path.join(settings.model_dir, "bible")
  e5_dir = os.path.abspath(settings.e5_dir)
  _ensure_e5(e5_dir)
  gold = str(lexicon.LEXICON_DIR / NATURAL_LEXICON)
  setting = ["experiments/code_switch/e5_bible.gin"]
  bindings = [f"train.init_from_checkpoint='{e5_dir}'",
              f"BibleTasks.vocabulary_path='{os.path.join(e5_dir, 'vocabulary.model')}'", *settings.gin]
  runs = [("start", e5_dir, 0.0)]
  for objective in objectives:
    run_dir = os.path.join(root, objective)
    if ("bible", objective) not in done:
      print(f"\n=== bible: e5-small + {objective} for {settings.natural_steps} steps -> {run_dir}", flush=True)
    seconds = 0.0 if ("bible", objective) in done else harness.train(
        trainer, run_dir, [os.path.join(e5_dir, "model.gin"), *setting, f"experiments/code_switch/{objective}.gin"],
        bindings, settings.natural_steps)
    runs.append((objective, run_dir, seconds))
  rows = []
  for objective, run_dir, seconds in runs:
    key = ("bible", objective)
    if key in done:
      rows.append(done[key])
      continue
    print(f"\n--- scoring bible / {objective} ({run_dir})", flush=True)
    task = {"task": "bible", "normalize": NATURAL_NORMALIZE} if objective == "start" else {}
    result = _bli(Run.open(run_dir), settings, src="grc", tgt="en", gold=gold, **task)
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
    elif row["objective"] == "tcs_gold":
      name = "+ TCS, gold dictionary kept at 50% (control)"
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
  labels = {"start": "starting model", "mlm": "MLM", "tcs": "TCS-MLM", "scs": "SCS-MLM",
            "tcs_gold": "TCS-MLM, 50%-correct gold dictionary"}
  layers = next(r["per_layer"]["layers"] for r in rows if r["setting"] == setting)
  return rsim.plot_delta_rsim({labels[k]: v for k, v in curves.items()}, "MLM", path, layers=layers,
                              title=f"{setting}: RSIM per layer and ΔRSIM against continued MLM")


def _choices(settings: CodeSwitchSettings) -> tuple[list[str], dict[str, list[str]]]:
  """(settings, {setting: objectives}); UserError for unknown names or gc outside the debian setting."""
  from flax_xalign.errors import UserError

  chosen_settings = harness.split_choices(settings.settings, SETTINGS + tuple(ALIASES), "settings")
  chosen_settings = list(dict.fromkeys(ALIASES.get(s, s) for s in chosen_settings))
  asked = harness.split_choices(settings.objectives, OBJECTIVES, "objectives") if settings.objectives else None
  chosen = {s: list(asked or DEFAULT_OBJECTIVES[s]) for s in chosen_settings}
  for setting, objectives in chosen.items():
    if setting != "synthetic" and "tcs_gold" in objectives:
      raise UserError(f"--objectives=tcs_gold needs the true token map, which only the synthetic setting has "
                      f"(asked for {setting}).")
    if setting != "debian" and "gc" in objectives:
      raise UserError(f"--objectives=gc runs in the debian setting only; the {setting} MLM-GC runs are "
                      "`xalign mlm_gc`.")
  return chosen_settings, chosen


def run(settings: CodeSwitchSettings, *, trainer: harness.Trainer) -> int:
  """Every chosen setting trained through `trainer` and scored (finished rows kept), then the tables and
  plots written and printed; 0 (a refusal is a UserError before any work)."""
  chosen, objectives = _choices(settings)
  debian_setting = e5_debian.DebianSetting.of(settings)
  if "debian" in chosen:
    e5_debian.check_args(debian_setting)
  results = harness.Results(settings.model_dir, settings, fresh=settings.fresh)
  done, save = results.done, results.save
  rows: list[dict] = []
  if "synthetic" in chosen:
    rows += synthetic_rows(trainer, settings, objectives["synthetic"], done, save)
  if "bible" in chosen:
    rows += bible_rows(trainer, settings, objectives["bible"], done, save)
  if "debian" in chosen:
    rows += e5_debian.rows(trainer, debian_setting, objectives["debian"], results)
  debian = [r for r in rows if r["setting"] == "debian"]
  others = [r for r in rows if r["setting"] != "debian"]
  tables = ([format_table(others)] if others else []) + (
      [e5_debian_report.format_table(debian), e5_debian_report.format_languages(debian)] if debian else [])
  table = "\n\n".join(tables)
  plots = [p for s in chosen if s != "debian"
           and (p := plot(rows, s, os.path.join(settings.model_dir, f"rsim_{s}.png")))]
  title = f"e5-small continued {settings.debian_steps} steps on the help text"
  if debian and (p := e5_debian_report.plot(debian, os.path.join(settings.model_dir, "rsim_debian.png"), title=title)):
    plots.append(p)
  seconds = results.finish(rows, table)
  print("\n" + table + f"\n\nplots: {', '.join(plots) or 'none'}; wall time {seconds / 60:.1f} min; results in "
        f"{settings.model_dir}", flush=True)
  return 0
