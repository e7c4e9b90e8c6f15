"""Several models side by side: what each one is, and one AER table and plot for all.

The evaluations live in `mlm_eval`, `word_align` and `alignment_score`; this
module reads run manifests and puts several models' results together for
notebooks/evaluate.ipynb (and any other report):

    models = report.describe_all([("multilingual-e5-small", "runs/e5"), ...])  # each run opened once
    print(models["multilingual-e5-small"].format())
    results = {label: report.evaluate_alignment(summary.handle, settings={"encoding": "separate"})
               for label, summary in models.items()}
    print(report.best_layer_table(results))
    report.plot_layers(results, "runs/evaluation/aer_layers.png")
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from flax_xalign import ops
from flax_xalign import storage
from flax_xalign.errors import UserError
from flax_xalign.evaluation.word_alignment import aer
from flax_xalign.fileio import write_atomically
from flax_xalign.run_spec import RunSpec

# The keys of an aligner settings dict: AlignmentSolver's fields, and evaluate_alignment's own options.
SOLVER_SETTINGS = tuple(f.name for f in dataclasses.fields(ops.AlignmentSolver))
ALIGNMENT_SETTINGS = ("normalize", "encoding", "pair_layout", "max_length", "batch_size", "layers", "methods")
_HOW_TO_MAKE = ("make the models with `xalign e5_small --output=runs/e5` (the imported "
                "multilingual-e5-small) or `xalign demo --start=scratch` (trained runs in runs/demo/cold and runs/demo/xlm_align), "
                "or change MODEL_DIRS")


@dataclasses.dataclass(frozen=True)
class ModelSummary:
  """What one MODEL_DIR holds, from its run manifest (and origin.json for an import).

  Attributes:
    label: the name the report shows.
    model_dir: the MODEL_DIR.
    step: the checkpoint step described (the latest unless the run was opened at another).
    run: the run manifest (`runs.Run.spec`).
    origin: origin.json of an imported model (`RunDir.origin`), else None.
    num_params: parameters of the encoder with its MLM head.
    handle: the run itself (`runs.Run` at `step`): what the evaluations take.
  """

  label: str
  model_dir: str
  step: int
  run: RunSpec
  origin: Mapping[str, Any] | None
  num_params: int
  handle: Any = dataclasses.field(repr=False, compare=False)  # A Run: not part of what the summary says.

  @property
  def imported(self) -> bool:
    return self.origin is not None

  @property
  def fresh_params(self) -> tuple[str, ...]:
    """Parameters an import initialised instead of reading (e.g. a missing MLM head)."""
    return tuple((self.origin or {}).get("initialised_not_imported", ()))

  def mlm_skip_reason(self) -> str | None:
    """Why masked-token accuracy does not apply (None: it does, the run was trained here)."""
    if self.run.objectives:
      return None
    fresh_head = [name for name in self.fresh_params if name.startswith("mlm_head")]
    if fresh_head:
      return (f"imported without an MLM head ({len(fresh_head)} mlm_head arrays were freshly initialised, "
              "origin.json), so its predictions are noise")
    return "no training task is recorded (nothing trained it here), so there is no held-out split to score"

  def format(self) -> str:
    """A few lines: origin or task and objectives, model size, vocabulary, languages, assets."""
    run, model = self.run, self.run.model
    kind = "imported model" if self.imported else "trained run"
    lines = [f"{self.label}  ({self.model_dir}, {kind}, step {self.step})"]
    if self.imported:
      source = self.origin.get("model") or self.origin.get("source") or "source not recorded"
      form = self.origin.get("format")
      lines.append(f"  origin: {source}" + (f" ({form})" if form else ""))
      if self.fresh_params:
        lines.append(f"  freshly initialised, not imported: {', '.join(self.fresh_params)}")
    else:
      objectives = ", ".join(f"{name} {weight:g}" for name, weight in run.objectives.items())
      lines.append(f"  task: {run.task}; objectives: {objectives}"
                   + (f"; monitors: {', '.join(run.monitors)}" if run.monitors else ""))
      if run.init_from_checkpoint:
        lines.append(f"  warm-started from: {run.init_from_checkpoint}")
    languages = (f"{model.num_languages} language embeddings" if model.num_languages
                 else "no language embeddings")
    lines.append(f"  model: {self.num_params / 1e6:.2f}M parameters, {model.num_layers} layers, embed "
                 f"{model.embed_dim}, {model.num_heads} heads x {model.head_dim}, mlp {model.mlp_dim}, {languages}")
    vocab = run.vocabulary
    doubled = f" ({vocab.pieces:,} pieces x {vocab.factor})" if vocab.factor != 1 else ""
    lines.append(f"  vocabulary: {vocab.kind}, {vocab.size:,} ids{doubled}")
    pairs = ", ".join(f"{a}->{b}" for a, b in run.language_pairs) or "none"
    lines.append(f"  languages: {', '.join(run.languages) or 'none'}; bitext pairs: {pairs}")
    lines.append(f"  assets: {', '.join(sorted(run.assets)) or 'none'}")
    return "\n".join(lines)


def describe(run: Any, *, label: str | None = None) -> ModelSummary:
  """What `run` (a `runs.Run`) is at its step, from its manifest (and origin.json); loads no parameters."""
  import jax

  from flax_xalign.models.flops import count_params

  origin = None
  if storage.isfile(run.dir.origin):
    origin = json.loads(storage.read_text(run.dir.origin))
  model = run.model
  shapes = jax.eval_shape(lambda key: model.init(key, batch=1, length=8), jax.random.key(0))
  return ModelSummary(label=label or run.path, model_dir=run.path, step=run.step, run=run.spec,
                      origin=origin, num_params=count_params(shapes), handle=run)


def describe_all(model_dirs: Sequence[tuple[str, str]]) -> dict[str, ModelSummary]:
  """{label: ModelSummary} of (label, MODEL_DIR) pairs, in order, each run opened once at its latest step.

  Labels must be distinct. A notebook's edge: the summaries' `handle`s are
  what the evaluations take.
  """
  from flax_xalign.runs import Run
  from flax_xalign.runs.checkpoints import find_latest_step

  labels = [label for label, _ in model_dirs]
  if not labels:
    raise UserError(f"MODEL_DIRS is empty; name at least one (label, MODEL_DIR): {_HOW_TO_MAKE}.")
  repeated = sorted({label for label in labels if labels.count(label) > 1})
  if repeated:
    raise UserError(f"MODEL_DIRS repeats the label(s) {', '.join(map(repr, repeated))}; give each model its own.")
  for _, model_dir in model_dirs:
    if find_latest_step(model_dir) is None:
      raise UserError(f"{model_dir} has no checkpoint; {_HOW_TO_MAKE}.")
  return {label: describe(Run.open(model_dir), label=label) for label, model_dir in model_dirs}


# ------------------------------------------------------------------ word alignment


def evaluate_alignment(run: Any, *, settings: Mapping[str, Any] | None = None, **kwargs: Any
                       ) -> dict[str, Any]:
  """`word_align.evaluate_alignment` with the aligner's settings in one flat dict.

  Args:
    run: a `runs.Run` (e.g. a summary's `handle`), at the step to score.
    settings: AlignmentSolver fields (`similarity`, `sinkhorn_kernel`, `mu`, ...) and
      evaluate_alignment options (`normalize`, `encoding`, `max_length`, `batch_size`,
      `layers`, `methods`) together, as a notebook's parameters hold them.
    **kwargs: the rest of evaluate_alignment's arguments (split, max_pairs, output_dir, verbose).
  """
  from flax_xalign.evaluation.word_alignment import word_align
  settings = dict(settings or {})
  unknown = sorted(set(settings) - set(SOLVER_SETTINGS) - set(ALIGNMENT_SETTINGS))
  if unknown:
    raise UserError(f"unknown aligner setting(s) {', '.join(unknown)}; use "
                    f"{', '.join(SOLVER_SETTINGS + ALIGNMENT_SETTINGS)}.")
  similarity = settings.pop("similarity", None)  # None: the model's (word_alignment.model_defaults).
  solver = ops.AlignmentSolver(**{k: v for k, v in settings.items() if k in SOLVER_SETTINGS})
  options = {k: v for k, v in settings.items() if k in ALIGNMENT_SETTINGS}
  kwargs.setdefault("verbose", False)
  return word_align.evaluate_alignment(run, options=solver, similarity=similarity, **options, **kwargs)


def _aligner_name(result: Mapping[str, Any]) -> str:
  """The encoding, similarity and every solver setting that differs from the paper's default."""
  parts = [result["encoding"], result["similarity"]]
  default = ops.AlignmentSolver()
  for field in ("sinkhorn_kernel", "sinkhorn_order", "sinkhorn_extraction"):
    if result.get(field, getattr(default, field)) != getattr(default, field):
      parts.append(f"{result[field]} {field.removeprefix('sinkhorn_')}")
  if result.get("pair_layout", "restart") != "restart":
    parts.append(f"{result['pair_layout']} pair layout")
  if result.get("normalize"):
    parts.append(result["normalize"])
  return ", ".join(parts)


def best_layer_table(results: Mapping[str, Mapping[str, Any]], *, show_aligner: bool = True,
                     peers: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None) -> str:
  """Markdown: AER/P/R of each model and method at its best layer, under the diagonal reference.

  Args:
    results: {label: `evaluate_alignment` result}, all on the same pairs.
    show_aligner: include the aligner-settings column (the demo's table, one
      setting for all models, leaves it out).
    peers: {label: {method: scores dict}} of aligners that are not ours
      (e.g. eflomal's symmetrisations), scored on the same pairs; rows after
      the diagonal.
  """
  if not results:
    raise UserError("no alignment results to tabulate; MODEL_DIRS is empty.")
  pairs = {r["pairs"] for r in results.values()}
  if len(pairs) != 1:
    raise UserError(f"the models were aligned on different numbers of pairs ({sorted(pairs)}); "
                    "their AERs are not comparable.")
  def row(cells):
    return "| " + " | ".join(cells) + " |"

  def scores(s):
    return [f"{100 * s['aer']:.1f}", f"{100 * s['precision']:.1f}", f"{100 * s['recall']:.1f}"]

  def aligner(cell):  # The optional column; `cell` is called only when it is shown.
    return [cell()] if show_aligner else []

  lines = [row(["model", *aligner(lambda: "aligner"), "method", "best layer", "AER", "precision", "recall"]),
           "|" + "|".join(["---"] * (3 if show_aligner else 2) + ["---:"] * 4) + "|"]
  diagonal = next(iter(results.values()))["diagonal_baseline"]
  lines.append(row(["(no model)", *aligner(lambda: "word i -> i·m/n"), "diagonal", "-", *scores(diagonal)]))
  for label, methods in (peers or {}).items():
    for method, peer in methods.items():
      lines.append(row([label, *aligner(lambda: "statistical"), method, "-", *scores(peer)]))
  for label, result in results.items():
    for method in result["methods"]:
      best = result["best"][method]
      lines.append(row([label, *aligner(lambda: _aligner_name(result)), method, str(best["layer"]),
                        *scores(best)]))
  return "\n".join(lines)


def layer_table(results: Mapping[str, Mapping[str, Any]]) -> dict[tuple[str, str, int], dict]:
  """{(label, method, layer): scores}, the sweep table `aer.format_table` / `plot_layer_curve` read."""
  return {(label, method, int(layer)): scores for label, result in results.items()
          for method, by_layer in result["scores"].items() for layer, scores in by_layer.items()}


def plot_layers(results: Mapping[str, Mapping[str, Any]], path: str, *, title: str | None = None) -> str:
  """One AER-per-layer plot of every model and method (PNG at `path`); returns `path`."""
  return aer.plot_layer_curve(layer_table(results), path, title=title)


# ------------------------------------------------------------------ other sections


def format_alignment(score: Mapping[str, Any]) -> str:
  """One line of `alignment_score.score_assets`' result."""
  return (f"alignment score {100 * score['all']:.1f}% of {score['count_all']} translatable tokens; "
          f"{100 * score['heldout']:.1f}% of the {score['count_heldout']} held out of the training dictionary")


def optional_evaluation(name: str) -> Any | None:
  """`flax_xalign.evaluation.<name>` (e.g. "lexicon.bli") if this version has it, else None (a broken module still raises)."""
  module = f"flax_xalign.evaluation.{name}"
  try:
    return importlib.import_module(module)
  except ModuleNotFoundError as e:
    if e.name == module:
      return None
    raise


def env_override(variable: str, default: Any) -> Any:
  """$variable parsed as JSON (taken as a plain string when it is not JSON), or `default` when unset.

  How a notebook's parameters cell lets a test or a CI job set its parameters
  without papermill (papermill's injected cell still comes after and wins).
  """
  value = os.environ.get(variable)
  if value is None:
    return default
  try:
    return json.loads(value)
  except json.JSONDecodeError:
    return value


def slug(label: str) -> str:
  """A folder name for a model's label."""
  return re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("._") or "model"


def write_json(path: str, value: Any) -> str:
  """Writes `value` as indented JSON (atomically); returns `path`."""
  write_atomically(path, json.dumps(value, indent=2, default=str) + "\n")
  return path
