"""Table 1 and Fig. 3 of Lu, Lu & Zhang (2023) on real languages from Debian (`xalign bli_table`): X -> English
BLI per language with `xalign bli`'s evaluation (`evaluate_lexicon`), the paper's XLM-R base beside ours.

The command's docstring says what is scored and written; `plan` checks every input and the output folder
before any work, `write_table` scores and writes (OUTPUT/bli_table.json, .md, bli_per_layer.png and the
exported CSLS dictionaries OUTPUT/dict/<x>-en.tsv) and prints the JSON summary last.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Sequence

from flax_xalign.errors import UserError

DEFAULT_LANGUAGES = ("ar", "de", "el", "fr", "hi", "ru")
TASK_PREFIX = "bli_table"
# Lu, Lu & Zhang (2023) Table 1, XLM-R base (Hit@1, Hit@5 in %, RSIM) and exported dictionary sizes.
PAPER_XLMR_BASE = {
    "hit@1": {"ar": 44.12, "bg": 58.61, "de": 48.33, "el": 52.58, "fr": 49.03, "hi": 48.92, "id": 47.00,
              "ja": 62.38, "ko": 63.77, "ru": 59.43, "avg": 53.42},
    "hit@5": {"ar": 68.04, "de": 60.86, "el": 65.09, "fr": 59.10, "hi": 60.74, "ja": 75.37, "ru": 75.55},
    "rsim": {"ar": 0.46, "de": 0.63, "el": 0.50, "fr": 0.64, "hi": 0.40, "ja": 0.52, "ru": 0.68},
    "dictionary": {"ar": 1505, "de": 2187, "el": 1223, "fr": 2164, "hi": 1159, "ja": 2501, "ru": 4077},
}




@dataclasses.dataclass(frozen=True)
class BliTableSettings:
  """The command's flags: the model, the `xalign debian_data` build, and what to score."""

  model_dir: str
  data_dir: str
  languages: str = ",".join(DEFAULT_LANGUAGES)  # Comma list of X (X -> en).
  split: str = "test"  # Gold words to score: dev or test.
  min_count: int = 5  # Language-specific vocabularies: count > N.
  select_min_count: str | None = None  # Comma list: choose min_count among these on the dev words first.
  layers: str = "all"  # 'all', a comma list, or 'none' (layer 0 only).
  max_sentences: int = 1000  # Sentences per language for layers > 0.
  knn: int = 10  # K of CSLS.
  output: str | None = None  # Output folder (None: MODEL_DIR/bli_table).


@dataclasses.dataclass(frozen=True)
class TablePlan:
  """What `plan` checked: the languages X, the min_count candidates (None: no selection), the output folder."""

  codes: list[str]
  candidates: list[int] | None
  output: str


# What the command writes into --output (an earlier run's folder holds only these).
OUTPUT_FILES = {"dict", "bli_table.json", "bli_table.partial.json", "bli_table.md", "bli_per_layer.png"}


def text_file(data_dir: str, code: str) -> str:
  """X's monolingual text: the help training split, else the UI catalogues' translations."""
  for path in (os.path.join(data_dir, "help", f"{code}.train.txt"), os.path.join(data_dir, "gettext", f"{code}.txt")):
    if os.path.isfile(path):
      return path
  raise UserError(f"no text for {code!r} in {data_dir} (help/{code}.train.txt or gettext/{code}.txt); build it "
                  f"with `xalign debian_data --output={data_dir} --languages={code}`.")


def gold_file(data_dir: str, code: str, split: str) -> str:
  path = os.path.join(data_dir, "bli", f"{code}-en.{split}.txt")
  if not os.path.isfile(path):
    raise UserError(f"{path} is missing; build the gold with `xalign debian_data "
                    f"--output={data_dir} --languages={code}` (sources include bli).")
  return path


def register_pair(data_dir: str, code: str, vocabulary_path: str) -> str:
  """Registers X's and English's text under the model's vocabulary; returns the mixture's name."""
  from flax_xalign.tasks import user

  tag = f"{TASK_PREFIX}_{abs(hash((os.path.abspath(data_dir), vocabulary_path))) % 10**8}"
  names = []
  for lang in (code, "en"):
    name = f"{tag}_{lang}"
    user.TextTask(name=name, files={"train": text_file(data_dir, lang)}, lang=lang,
                  vocabulary_path=vocabulary_path).register()
    names.append(name)
  return user.AlphaMixture(name=f"{tag}_{code}_en", tasks=tuple(names)).register().name


def evaluate_language(run, code: str, settings: BliTableSettings, *, split: str, min_count: int,
                      layers: str | None, output: str | None) -> dict:
  from flax_xalign.evaluation.lexicon.lexicon_eval import LexiconOptions, evaluate_lexicon

  task = register_pair(settings.data_dir, code, run.dir.file("vocabulary.model"))
  options = LexiconOptions(src=code, tgt="en", task=task, gold=gold_file(settings.data_dir, code, split),
                           min_count=min_count, knn=settings.knn, layers=layers,
                           max_sentences=settings.max_sentences,
                           output=output)
  return evaluate_lexicon(run, options, log=lambda line: print(f"[{code}] {line}", flush=True))


def select_min_count(run, codes: Sequence[str], settings: BliTableSettings, candidates: Sequence[int]) -> dict:
  """{min_count: {code: correct dev words}} at layer 0 and the chosen value (the most correct in total)."""
  correct: dict[int, dict[str, int]] = {}
  for value in candidates:
    correct[value] = {}
    for code in codes:
      result = evaluate_language(run, code, settings, split="dev", min_count=value, layers=None, output=None)
      correct[value][code] = round(result["csls"]["hit@1"] * result["pairs"])
    print(f"min_count {value}: {sum(correct[value].values())} dev words right (CSLS Hit@1) "
          f"{correct[value]}", flush=True)
  chosen = max(candidates, key=lambda value: (sum(correct[value].values()), -value))
  return {"candidates": list(candidates), "dev_correct": correct, "chosen": chosen}


def row_of(code: str, result: dict) -> dict:
  return {"lang": code, "nn_hit@1": result["nn"]["hit@1"], "nn_hit@5": result["nn"]["hit@5"],
          "csls_hit@1": result["csls"]["hit@1"], "csls_hit@5": result["csls"]["hit@5"],
          "rsim": result["per_layer"]["rsim"][0] if "per_layer" in result else None,
          "dictionary": result.get("dictionary_entries"), "vocab_sizes": result["vocab_sizes"],
          "gold_entries": result["entries"], "covered": result["covered"], "coverage": result["coverage"],
          "queries": result["pairs"], "out_of_coverage": result["out_of_coverage"]}


def format_table(rows: Sequence[dict]) -> str:
  """Markdown: ours (e5-small) beside the paper's XLM-R base, per language and the average."""
  paper = PAPER_XLMR_BASE
  lines = ["| X -> en | CSLS Hit@1 (paper) | CSLS Hit@5 (paper) | NN Hit@1 | NN Hit@5 | RSIM (paper) | "
           "dictionary (paper) | coverage | queries |", "|---" * 9 + "|"]

  def ref(kind: str, code: str, scale: str = ".2f") -> str:
    value = paper[kind].get(code)
    return "-" if value is None else format(value, scale)

  for row in rows:
    code = row["lang"]
    rsim = "-" if row["rsim"] is None else f"{row['rsim']:.2f}"
    lines.append(f"| {code} | {100 * row['csls_hit@1']:.2f} ({ref('hit@1', code)}) | {100 * row['csls_hit@5']:.2f} "
                 f"({ref('hit@5', code)}) | {100 * row['nn_hit@1']:.2f} | {100 * row['nn_hit@5']:.2f} | {rsim} "
                 f"({ref('rsim', code)}) | {row['dictionary']} ({ref('dictionary', code, 'd')}) | "
                 f"{row['covered']}/{row['gold_entries']} ({100 * row['coverage']:.1f}%) | {row['queries']} |")
  if rows:
    mean = {k: sum(r[k] for r in rows) / len(rows) for k in ("csls_hit@1", "csls_hit@5", "nn_hit@1", "nn_hit@5")}
    codes = [r["lang"] for r in rows]
    paper_mean = [paper["hit@1"][c] for c in codes if c in paper["hit@1"]]
    paper_avg = f"{sum(paper_mean) / len(paper_mean):.2f}" if len(paper_mean) == len(codes) else "-"
    rsims = [r["rsim"] for r in rows if r["rsim"] is not None]
    lines.append(f"| avg | {100 * mean['csls_hit@1']:.2f} ({paper_avg}) | {100 * mean['csls_hit@5']:.2f} | "
                 f"{100 * mean['nn_hit@1']:.2f} | {100 * mean['nn_hit@5']:.2f} | "
                 f"{(sum(rsims) / len(rsims)) if rsims else float('nan'):.2f} | | | |")
  return "\n".join(lines) + "\n"


def plot_per_layer(curves: dict, path: str, title: str) -> str:
  """Fig. 3's shape in one figure: Hit@1 (CSLS), mean pair cosine and RSIM per layer; thin lines per
  language, the mean thick."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from flax_xalign.fileio import save_figure

  panels = (("hit@1_csls", "Hit@1 CSLS (%)", 100.0), ("mean_cosine", "mean cosine of gold pairs", 1.0),
            ("rsim", "RSIM", 1.0))
  fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
  for ax, (key, label, scale) in zip(axes, panels):
    series = []
    for code, curve in curves.items():
      values = [scale * v for v in curve[key]]
      series.append(values)
      ax.plot(curve["layers"], values, linewidth=1, alpha=0.6, label=code)
    layers = next(iter(curves.values()))["layers"]
    ax.plot(layers, [sum(col) / len(col) for col in zip(*series)], color="black", linewidth=2.5, label="mean")
    ax.set_xlabel("layer (0 = token embeddings)")
    ax.set_ylabel(label)
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=8)
  fig.suptitle(title)
  fig.tight_layout()
  save_figure(fig, path)
  plt.close(fig)
  return path


def plan(settings: BliTableSettings) -> TablePlan:
  """Every input and the output folder checked before any work (UserError naming the flag and the fix); the
  model folder is the caller's to check after these (`xalign bli_table`: `common.existing_model_dir`)."""
  codes = [c.strip() for c in settings.languages.split(",") if c.strip()]
  if not codes or "en" in codes:
    raise UserError(f"--languages={settings.languages!r}: name the languages X scored X -> en (not en), e.g. de,fr.")
  if settings.max_sentences < 1 or settings.knn < 1 or settings.min_count < 0:
    raise UserError("--max_sentences and --knn must be at least 1, --min_count at least 0.")
  candidates = None
  if settings.select_min_count:
    try:
      candidates = [int(v) for v in settings.select_min_count.split(",") if v.strip()]
    except ValueError:
      raise UserError(f"--select_min_count={settings.select_min_count!r}: give integers, e.g. 2,5,10.") from None
  for code in codes:  # Missing files are reported before anything slow runs.
    text_file(settings.data_dir, code), gold_file(settings.data_dir, code, "dev" if candidates else settings.split)
  text_file(settings.data_dir, "en")
  from flax_xalign.fileio import check_output_folder

  # New, empty or an earlier table's folder; never the model or the data (checked before any work).
  output = check_output_folder(settings.output or os.path.join(settings.model_dir, "bli_table"), setting="--output",
                               inputs={"--data_dir": settings.data_dir},
                               owned=lambda folder: set(os.listdir(folder)) <= OUTPUT_FILES,
                               what="an earlier bli_table output")
  return TablePlan(codes=codes, candidates=candidates, output=output)


def write_table(settings: BliTableSettings, checked: TablePlan) -> dict:
  """Scores every language of `checked` (`plan`'s) on MODEL_DIR, writes the outputs, prints the table and the
  JSON summary (last); returns the summary."""
  from flax_xalign.fileio import makedirs
  from flax_xalign.runs import Run

  codes, candidates, output = checked.codes, checked.candidates, checked.output
  run_ = Run.open(settings.model_dir)
  makedirs(os.path.join(output, "dict"), setting="--output")
  start = time.perf_counter()
  selection = select_min_count(run_, codes, settings, candidates) if candidates else None
  min_count = selection["chosen"] if selection else settings.min_count
  layers = None if settings.layers in ("none", "0") else settings.layers
  rows, curves, results = [], {}, {}
  for code in codes:
    t0 = time.perf_counter()
    # Table 1 on the full language-specific vocabularies (layer 0 only); Fig. 3 in a second pass, whose
    # contextual layers keep only the tokens seen in --max_sentences sentences.
    result = evaluate_language(run_, code, settings, split=settings.split, min_count=min_count, layers="0",
                               output=os.path.join(output, "dict", f"{code}-en.tsv"))
    rows.append(row_of(code, result))
    results[code] = {"layer0": result}
    if layers is not None:
      deep = evaluate_language(run_, code, settings, split=settings.split, min_count=min_count, layers=layers,
                               output=None)
      curves[code] = results[code]["per_layer"] = deep["per_layer"]
      results[code]["per_layer_vocab_sizes"] = deep["vocab_sizes"]
    results[code]["seconds"] = round(time.perf_counter() - t0, 1)
    _write_json(os.path.join(output, "bli_table.partial.json"), {"rows": rows, "per_layer": curves})
    print(f"[{code}] done in {time.perf_counter() - t0:.1f} s", flush=True)
  table = format_table(rows)
  print(table, flush=True)
  summary = {"model_dir": os.path.abspath(settings.model_dir), "data_dir": os.path.abspath(settings.data_dir),
             "split": settings.split, "min_count": min_count, "min_count_selection": selection, "knn": settings.knn,
             "max_sentences": settings.max_sentences, "rows": rows, "per_layer": curves,
             "paper_xlmr_base": PAPER_XLMR_BASE, "seconds": round(time.perf_counter() - start, 1), "results": results}
  _write_json(os.path.join(output, "bli_table.json"), summary)
  from flax_xalign.fileio import write_atomically

  write_atomically(os.path.join(output, "bli_table.md"), table)
  if curves:
    name = os.path.basename(os.path.normpath(settings.model_dir))
    summary["plot"] = plot_per_layer(curves, os.path.join(output, "bli_per_layer.png"),
                                     f"{name}: X -> en gold pairs per layer ({settings.split} words)")
  brief = {k: v for k, v in summary.items() if k not in ("results", "per_layer", "paper_xlmr_base")}
  print(json.dumps(brief, ensure_ascii=False), flush=True)
  return brief


def _write_json(path: str, value: dict) -> None:
  from flax_xalign.fileio import write_atomically

  write_atomically(path, json.dumps(value, indent=1, ensure_ascii=False, default=str) + "\n")
