"""The Debian setting of the code-switching and MLM-GC drivers: e5-small continued on many languages.

multilingual-e5-small (imported offline, trimmed to the pieces of the help
text: `--debian_e5_dir`, imported there if missing) is continued on the
MONOLINGUAL LibreOffice help text of every built language and English
(`e5_debian_help_mlm`, DebianTasks' `{prefix}_mlm`: no bitext) with each
objective (mlm, tcs, scs, gc, gc_output) for the same `--debian_steps`, batch
and learning-rate schedule (gin_configs/experiments/code_switch/e5_debian.gin),
once per seed (`--seeds`, default 2; a seed changes the data order and the
masks, the starting weights are e5's). The GC runs count their co-occurrence
table over the same mixture: the first seed when it starts, the later seeds
read that run's table.

Every model, the starting one included, is scored on:

* BLI per language X -> English at the embedding layer: Hit@1/5 of NN and
  CSLS over the X / English language-specific vocabularies (count >
  --min_count), against the gold `--debian_gold` (a template with {lang};
  default DEBIAN_DATA/bli/{lang}-en.test.txt). Where that file is missing,
  a provisional gold is written by inverting DEBIAN_DATA/dict/en-{lang}.tsv
  (one-word entries only); languages with neither are left out of BLI;
* RSIM and the gold-pair cosine per layer over the gold pairs whose words
  occur in --debian_eval_sentences sentences of each side (contextual
  states averaged over them; a second `bli` pass, so the layer-0 scores
  above keep the whole vocabulary);
* "MUSE cosine" (Ai & Fang, Table 2): the gold pairs' mean cosine at the
  embedding layer beside the mean over shuffled pairs (`bli --isomorphism`);
* sentence retrieval on the held-out help paragraph pairs en-X (the first
  --debian_retrieval_pairs of help_bitext/en-X.test.tsv), cosine and CSLS,
  best layer, both directions averaged.

Rows are keyed (setting, objective, seed) in MODEL_DIR/results.json, so a rerun
skips finished training and scoring; `e5_debian_report` makes the table and the
Fig. 7-shaped ΔRSIM plot (mean over seeds, spread shown). The setting's flags
(`--debian_*`, `--seeds`) are `cli/experiments/__init__.py`'s; here they are the
fields of `DebianSetting`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, Callable, Sequence

from flax_xalign.experiments import harness
from flax_xalign.run_dir import RunDir

SETTING = "debian"
OBJECTIVES = ("mlm", "tcs", "scs", "gc", "gc_output")
OBJECTIVE_GIN = {"mlm": "experiments/code_switch/mlm.gin", "tcs": "experiments/code_switch/tcs.gin",
                 "scs": "experiments/code_switch/scs.gin", "gc": "experiments/mlm_gc/gc.gin",
                 "gc_output": "experiments/mlm_gc/gc_output.gin"}
SETTING_GIN = "experiments/code_switch/e5_debian.gin"
PREFIX = "e5_debian_help"  # The training tasks' prefix (as in SETTING_GIN).
TRIM_PREFIX = "e5_trim_debian_help"  # The import's trimming reads the same text under its own names.
MIXTURE = f"{PREFIX}_mlm"
PIVOT = "en"
RETRIEVAL_MAX_LENGTH = 128  # Tokens of a help paragraph kept for retrieval (the model's limit if lower).


@dataclasses.dataclass(frozen=True, kw_only=True)
class DebianFlags:
  """The `--debian_*` / `--seeds` flags of the drivers that run the Debian setting (code_switch, mlm_gc), with
  the flags' defaults (`cli/experiments/__init__.add_debian_arguments`); their settings dataclasses take them
  from here."""

  debian_data: str = "runs/debian_data"
  debian_languages: str = ""
  debian_e5_dir: str = "runs/e5_debian"
  debian_steps: int = 80
  seeds: int = 2
  debian_gold: str = ""
  debian_eval_sentences: int = 200
  debian_retrieval_pairs: int = 100


@dataclasses.dataclass(frozen=True)
class DebianSetting(DebianFlags):
  """What the setting reads of a driver's settings (code_switch's or mlm_gc's): the driver's folder, the
  vocabularies' count threshold and extra gin bindings, and the `DebianFlags`."""

  model_dir: str
  min_count: int = 5
  gin: Sequence[str] = ()

  @classmethod
  def of(cls, settings: Any) -> "DebianSetting":
    """The setting's fields of a driver's settings (a dataclass with the same field names)."""
    return cls(**{f.name: getattr(settings, f.name) for f in dataclasses.fields(cls)})


def built_languages(data_dir: str) -> list[str]:
  """The build's help languages besides English (UserError naming the builder without a build)."""
  from flax_xalign.tasks import debian as debian_tasks

  return debian_tasks._built_languages(os.path.abspath(os.path.expanduser(data_dir)))


def languages_of(setting: DebianSetting) -> list[str]:
  from flax_xalign.errors import UserError

  built = built_languages(setting.debian_data)
  asked = [x.strip() for x in setting.debian_languages.split(",") if x.strip()]
  absent = [x for x in asked if x not in built]
  if absent:
    raise UserError(f"--debian_languages: {absent} have no help text in {setting.debian_data} (built: "
                    f"{', '.join(built)}).")
  return sorted(asked or built)


def ensure_e5(e5_dir: str, data_dir: str, languages: Sequence[str]) -> None:
  """Imports e5-small trimmed to the help text of every built language into `e5_dir` unless it is there
  (`xalign e5_small`'s work: `harness.import_e5`)."""
  from flax_xalign.tasks.debian import DebianTasks

  if os.path.isdir(RunDir(e5_dir).checkpoints):
    return
  DebianTasks(data_dir=data_dir, prefix=TRIM_PREFIX).register()
  print(f"importing multilingual-e5-small, trimmed to the help text of {', '.join(languages)} + en -> {e5_dir}",
        flush=True)
  harness.import_e5(e5_dir, trim_vocab_to=f"{TRIM_PREFIX}_mlm", languages=[PIVOT, *languages])


def register_tasks(data_dir: str, languages: Sequence[str], e5_dir: str) -> None:
  """The training tasks, as SETTING_GIN defines them (so scoring the starting model can read them)."""
  from flax_xalign.tasks.debian import DebianTasks

  DebianTasks(data_dir=data_dir, languages=tuple(languages), prefix=PREFIX,
              vocabulary_path=os.path.join(e5_dir, "vocabulary.model")).register()


def _provisional_gold(dictionary: str, output: str) -> int:
  """Writes the X -> English MUSE file of an en<TAB>X dictionary (one-word entries); entries written."""
  from flax_xalign.fileio import write_atomically

  seen, lines = set(), []
  with open(dictionary, encoding="utf-8") as f:
    for line in f:
      fields = line.rstrip("\n").split("\t")
      if len(fields) != 2 or any(not w or len(w.split()) != 1 for w in fields):
        continue
      pair = (fields[1], fields[0])
      if pair not in seen:
        seen.add(pair)
        lines.append(f"{pair[0]} {pair[1]}\n")
  if lines:
    write_atomically(output, "".join(lines))
  return len(lines)


def gold_for(setting: DebianSetting, lang: str, model_dir: str) -> tuple[str, str] | None:
  """(path, 'gold' | 'provisional') of X -> English BLI gold, or None when there is none."""
  template = setting.debian_gold or os.path.join(setting.debian_data, "bli", "{lang}-en.test.txt")
  path = template.format(lang=lang)
  if os.path.isfile(path):
    return path, "gold"
  dictionary = os.path.join(setting.debian_data, "dict", f"en-{lang}.tsv")
  if not os.path.isfile(dictionary):
    return None
  output = os.path.join(model_dir, "gold", f"{lang}-en.provisional.txt")
  if os.path.isfile(output) or _provisional_gold(dictionary, output):
    return output, "provisional"
  return None


def _bli_summary(result: dict[str, Any], kind: str) -> dict[str, Any]:
  keep = ("nn", "csls", "coverage", "pairs", "vocab_sizes", "muse_cosine", "gold")
  out = {k: result.get(k) for k in keep}
  out["gold_kind"] = kind
  iso = out.get("muse_cosine") or {}
  out["muse_cosine"] = {k: iso.get(k) for k in ("mean", "shuffled_mean", "pairs") if k in iso} or None
  return out


def _retrieval_summary(result: dict[str, Any]) -> dict[str, Any]:
  def both(score: dict[str, Any]) -> float:
    return (score["src_to_tgt"] + score["tgt_to_src"]) / 2

  best = {m: {"layer": b["layer"], "accuracy": both(b)} for m, b in result["best"].items()}
  per_layer = {m: [both(result["scores"][m][str(layer)]) for layer in result["layers"]] for m in result["methods"]}
  bag = {m: both(b) for m, b in result["baselines"]["bag_of_pieces"].items()}
  return {"pairs": result["pairs"], "best": best, "per_layer": per_layer, "layers": result["layers"],
          "bag_of_pieces": bag, "chance": result["baselines"]["chance"]}


def evaluate(model_dir: str, setting: DebianSetting, languages: Sequence[str], *,
             log: Callable[[str], None] = print) -> dict[str, Any]:
  """BLI, RSIM, MUSE cosine and retrieval of one model, per language; with the seconds each part took."""
  from flax_xalign.errors import UserError
  from flax_xalign.evaluation.retrieval import RetrievalOptions, evaluate_retrieval
  from flax_xalign.runs import Run

  start = time.perf_counter()
  run = Run.open(model_dir)  # Once: BLI and retrieval score the same step.
  bli: dict[str, Any] = {}
  for lang in languages:
    gold = gold_for(setting, lang, setting.model_dir)
    if gold is None:
      log(f"  {lang}: no BLI gold (neither {setting.debian_gold or 'bli/{lang}-en.test.txt'} nor dict/en-{lang}.tsv)")
      continue
    log(f"\n  BLI {lang} -> {PIVOT} ({gold[1]} gold {gold[0]})")
    common = {"src": lang, "tgt": PIVOT, "gold": gold[0], "task": MIXTURE, "normalize": "",
              "min_count": setting.min_count}
    # Layer 0 alone first: with contextual layers, tokens absent from the sampled sentences drop out of
    # every layer, so Hit@k and the MUSE cosine would cover only the sample's words.
    try:
      result = harness.bli(run, isomorphism=True, **common)
      layers = harness.bli(run, layers="all", max_sentences=setting.debian_eval_sentences, **common)
    except UserError as e:  # E.g. no gold word is one token of the vocabulary: the other languages go on.
      log(f"  {lang}: no BLI ({e})")
      continue
    bli[lang] = {**_bli_summary(result, gold[1]), "per_layer": layers.get("per_layer"),
                 "per_layer_pairs": layers.get("pairs")}
  bli_seconds = time.perf_counter() - start
  retrieval: dict[str, Any] = {}
  config = run.model.encoder.config
  max_length = min(RETRIEVAL_MAX_LENGTH, config.max_positions - config.position_offset)
  for lang in languages:
    path = os.path.join(setting.debian_data, "help_bitext", f"en-{lang}.test.tsv")
    log(f"\n  retrieval en-{lang}")
    options = RetrievalOptions(tsv=path, src_lang=PIVOT, tgt_lang=lang, max_pairs=setting.debian_retrieval_pairs,
                               max_length=max_length)
    retrieval[lang] = _retrieval_summary(evaluate_retrieval(run, options, log=log))
  seconds = time.perf_counter() - start
  return {"bli": bli, "retrieval": retrieval,
          "eval_seconds": {"bli": bli_seconds, "retrieval": seconds - bli_seconds, "total": seconds}}


def _bindings(setting: DebianSetting, objective: str, e5_dir: str, seed: int) -> list[str]:
  data = os.path.abspath(os.path.expanduser(setting.debian_data))
  chosen = [x.strip() for x in setting.debian_languages.split(",") if x.strip()]
  return [f"E5_DIR='{e5_dir}'", f"DEBIAN_DATA='{data}'", f"E5_VOCABULARY='{os.path.join(e5_dir, 'vocabulary.model')}'",
          f"DEBIAN_LANGUAGES={sorted(chosen)!r}", f"SEED={seed}", f"EVAL_EVERY={setting.debian_steps}",
          *([f"LANG_VOCAB_MIN_COUNT={setting.min_count}"] if objective in ("mlm", "tcs", "scs") else [])]


def _cooc_binding(objective: str, seed: int, runs: Sequence[tuple[str, int, str]]) -> list[str]:
  """Later GC seeds read the first GC run's table (counted over the same mixture) instead of recounting."""
  if not objective.startswith("gc") or seed == 0:
    return []
  first = next((d for o, s, d in runs if o.startswith("gc") and s == 0), None)
  if first is None or not os.path.isfile(os.path.join(first, "cooc.json")):
    return []
  return [f"train.asset_options={{'cooc': {{'window': 2, 'path': '{first}'}}}}"]


def check_args(setting: DebianSetting) -> list[str]:
  """The setting's languages; UserError for a bad count or a missing build (before MODEL_DIR is made)."""
  from flax_xalign.errors import UserError

  for name in ("seeds", "debian_steps", "debian_eval_sentences", "debian_retrieval_pairs"):
    if getattr(setting, name) < 1:
      raise UserError(f"--{name}={getattr(setting, name)} must be at least 1.")
  return languages_of(setting)


def rows(trainer: harness.Trainer, setting: DebianSetting, objectives: Sequence[str],
         results: harness.Results) -> list[dict]:
  """Trains every (objective, seed) not finished through `trainer`, then scores the starting model and every run."""
  languages = check_args(setting)
  e5_dir = os.path.abspath(setting.debian_e5_dir)
  ensure_e5(e5_dir, os.path.abspath(os.path.expanduser(setting.debian_data)), built_languages(setting.debian_data))
  register_tasks(os.path.abspath(os.path.expanduser(setting.debian_data)), languages, e5_dir)
  root = os.path.join(setting.model_dir, SETTING)
  runs: list[tuple[str, int, str]] = []
  seconds: dict[tuple[str, int], float] = {}
  for objective in objectives:
    for seed in range(setting.seeds):
      run_dir = os.path.abspath(os.path.join(root, f"{objective}_seed{seed}"))
      key = (SETTING, objective, seed)
      if key not in results.done:
        print(f"\n=== {SETTING}: e5-small + {objective}, seed {seed}, {setting.debian_steps} steps -> {run_dir}",
              flush=True)
        files = [os.path.join(e5_dir, "model.gin"), SETTING_GIN, OBJECTIVE_GIN[objective]]
        bindings = [*_bindings(setting, objective, e5_dir, seed), *_cooc_binding(objective, seed, runs), *setting.gin]
        seconds[(objective, seed)] = harness.train(trainer, run_dir, files, bindings, setting.debian_steps)
      runs.append((objective, seed, run_dir))
  out = []
  for objective, seed, run_dir in [("start", 0, e5_dir), *runs]:
    key = (SETTING, objective, seed)
    if key in results.done:
      out.append(results.done[key])
      continue
    print(f"\n--- scoring {SETTING} / {objective} seed {seed} ({run_dir})", flush=True)
    scores = evaluate(run_dir, setting, languages)
    train_seconds = seconds.get((objective, seed)) or (0.0 if objective == "start" else
                                                       harness.logged_train_seconds(run_dir) or 0.0)
    row = {"setting": SETTING, "objective": objective, "seed": seed, "model_dir": run_dir,
           "steps": 0 if objective == "start" else setting.debian_steps, "seconds": train_seconds,
           "languages": list(languages), "mlm_accuracy": harness.mlm_accuracy(run_dir), **scores}
    print(f"    scored in {scores['eval_seconds']['total']:.0f} s", flush=True)
    out.append(row)
    results.save(row)
  return out


def write_rows(path: str, rows_: Sequence[dict]) -> None:
  """The rows alone (for docs/results), as JSON."""
  from flax_xalign.fileio import write_atomically

  write_atomically(path, json.dumps(list(rows_), indent=2, ensure_ascii=False) + "\n")
