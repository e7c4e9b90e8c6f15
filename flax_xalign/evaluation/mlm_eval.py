"""Held-out masked-token accuracy per language, next to a unigram baseline.

The baseline always predicts the language's most frequent training token (over
a sample of the training stream): an MLM that beats it has learned context, not
just frequencies. Masking uses fixed RNGs, so two evaluations of one checkpoint
agree exactly. Everything needed (model size, task, languages) is read from the
run manifest the checkpoint holds (`RunSpec`), so `evaluate(model_dir=...)` is
enough from a notebook. A run trained on the user's own files re-registers
its tasks from the manifest (`run_tasks.register_run_tasks`); `relocate`
points it at data that moved since training.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping, Sequence

import flax.linen as nn
import jax
import numpy as np

from flax_xalign.errors import UserError
from flax_xalign.fileio import write_atomically
from flax_xalign.models.encoder import Encoder
from flax_xalign.objectives.pretraining import PretrainingModel
from flax_xalign.run_spec import RunSpec
from flax_xalign.training import checkpoints as checkpoints_lib
from flax_xalign.training import partitioning


def load_model(model_dir: str, *, num_partitions: int = 1, step: int | None = None
               ) -> tuple[PretrainingModel, Any, RunSpec, int]:
  """(model, params, run manifest, step) of a checkpoint (the latest by default).

  The model is the plain masked forward pass (MLM) with the run's encoder
  config and special ids; objectives that need assets are not rebuilt.
  """
  # Checked first: a manager would create checkpoints/ in a mistyped path.
  latest = checkpoints_lib.find_latest_step(model_dir)
  if latest is None:
    raise UserError(f"{model_dir} has no checkpoint to evaluate; train first (python -m flax_xalign.train).")
  step = latest if step is None else step
  _, run, _ = checkpoints_lib.read_run_spec(model_dir, step=step)
  model = PretrainingModel(encoder=Encoder(run.model), objectives={"mlm": 1.0},
                           specials=run.vocabulary.specials, vocab_copies=run.vocabulary.factor)
  partitioner = partitioning.Partitioner(mesh=partitioning.make_mesh(num_partitions))
  boxed = jax.eval_shape(lambda k: model.init(k, batch=1, length=8), jax.random.key(0))
  shardings = partitioner.shardings_for(boxed)
  abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                          nn.meta.unbox(boxed), shardings)
  params = checkpoints_lib.restore_params(model_dir, abstract, step=step)
  return model, params, run, step


def register_run_tasks(run: RunSpec, *, model_dir: str | None = None, step: int | None = None,
                       **options: Any) -> None:
  """Re-registers the user-defined tasks (user files, synthetic languages) a run was trained on.

  A no-op when the run's task is registered already (and nothing else is
  asked for); `options` are `run_tasks.register_run_tasks`'s (relocate,
  splits, import_modules, user_tasks).
  """
  from flax_xalign import tasks
  from flax_xalign.evaluation import run_tasks

  if not (options.get("import_modules") or options.get("user_tasks")):
    if not run.task:
      return  # An imported model: trained on no task of ours.
    try:
      tasks.get_provider(run.task)
      return
    except UserError:
      pass
  run_tasks.register_run_tasks(run, model_dir=model_dir, step=step, **options)


def run_vocabulary(model_dir: str, run: RunSpec) -> Any:
  """The seqio vocabulary a run trained with, from its own copy in MODEL_DIR."""
  from flax_xalign.assets.vocabulary import load_run_vocabulary

  return load_run_vocabulary(model_dir, run.vocabulary)


def load_assets(model_dir: str, run: RunSpec, step: int, names: tuple[str, ...]) -> dict[str, Any]:
  """Host values of assets `names` as saved at checkpoint `step` (checked against its fingerprints)."""
  from flax_xalign.assets import registry

  register_run_tasks(run, model_dir=model_dir, step=step)
  _, _, fingerprints = checkpoints_lib.read_run_spec(model_dir, step=step)
  assets = {name: registry.create(name, run) for name in names}
  return checkpoints_lib.load_step_assets(model_dir, step, assets, fingerprints)


def synthetic_alignment(model_dir: str, params: Any, run: RunSpec, step: int) -> dict[str, Any] | None:
  """ALIGN-MLM alignment score (all / leak-free) of a run that has a token map, else None."""
  if "token_map" not in run.assets:
    return None
  from flax_xalign.evaluation.alignment_score import score_assets

  names = ("token_map", "dictionary") if "dictionary" in run.assets else ("token_map",)
  values = load_assets(model_dir, run, step, names)
  from flax_xalign.models.encoder import token_embedding_table

  table = token_embedding_table(params, run.model)
  return score_assets(np.asarray(jax.device_get(table)), values["token_map"],
                      values.get("dictionary"))


def unigram_counts(batches, num_languages: int, vocab_size: int, *, first_regular_id: int) -> np.ndarray:
  """[num_languages + 1, vocab] counts of maskable tokens per language id."""
  counts = np.zeros((num_languages + 1, vocab_size), np.int64)
  for batch in batches:
    tokens, langs = np.asarray(batch["tokens"]), np.asarray(batch["lang_ids"])
    keep = tokens >= first_regular_id
    np.add.at(counts, (langs[keep], tokens[keep]), 1)
  return counts


def evaluate(
    *,
    model_dir: str,
    split: str = "test",
    mixture_or_task_name: str | None = None,
    batch_size: int = 32,
    max_batches: int = 0,
    baseline_batches: int = 100,
    seed: int = 0,
    num_partitions: int = 1,
    output: str | None = "eval.json",
    relocate: Mapping[str, str] | None = None,
    import_modules: Sequence[str] = (),
    user_tasks: Sequence[Any] = (),
) -> dict[str, Any]:
  """Masked-token accuracy per language on `split`, written to MODEL_DIR/eval.json.

  Args:
    model_dir: a MODEL_DIR with checkpoints.
    split: held-out split to score ("validation" or "test").
    mixture_or_task_name: defaults to the task the checkpoint was trained on.
    batch_size: evaluation batch size.
    max_batches: 0 scores the whole split.
    baseline_batches: training batches sampled for the unigram baseline.
    seed: masking seed (fixed: evaluations are repeatable).
    num_partitions: 'model' mesh axis size.
    output: file name inside model_dir (None: do not write).
    relocate: recorded data folder -> its new place, for a run trained on
      files that have moved since (the run manifest records absolute paths),
      e.g. {"/old/data": "/new/data"}.
    import_modules: modules to import first, for tasks registered in Python
      that the run manifest could not record (a script's __main__).
    user_tasks: TextTask / TsvBitextTask / AlphaMixture specs to register
      first (e.g. to evaluate on another task).
  """
  from flax_xalign.training import validate
  from flax_xalign.training.data import resolve_task
  from flax_xalign.training.model_dir import check_model_dir

  model_dir = check_model_dir(model_dir, writable=bool(output))  # Read-only runs need only a name.
  for value, setting, least, example in ((batch_size, "evaluate.batch_size", 1, 32),
                                         (max_batches, "evaluate.max_batches", 0, 0),
                                         (baseline_batches, "evaluate.baseline_batches", 1, 100),
                                         (num_partitions, "evaluate.num_partitions", 1, 1)):
    validate.check_integer(value, setting, least=least, example=example)
  model, params, run, step = load_model(model_dir, num_partitions=num_partitions)
  register_run_tasks(run, model_dir=model_dir, step=step, relocate=relocate, splits=("train", split),
                     import_modules=import_modules, user_tasks=user_tasks)
  name = mixture_or_task_name or run.task
  lengths = dict(run.task_feature_lengths)
  languages = list(run.languages)
  data = resolve_task(name, languages=languages if name == run.task else None)
  if list(data.languages) != languages:
    raise UserError(f"{name!r} has languages {list(data.languages)} but {model_dir} was trained on "
                    f"{languages}; evaluate on a task with the run's languages.")
  if data.vocabulary_spec.sha256 != run.vocabulary.sha256:
    fix = ("its vocabulary file changed since training: restore it, or move it aside so that eval uses the "
           f"run's own copy ({os.path.join(model_dir, run.vocabulary.file)})" if name == run.task else
           "evaluate on a task with the run's vocabulary")
    raise UserError(f"{name!r} tokenises with another vocabulary than {model_dir} was trained with (sha256 "
                    f"{data.vocabulary_spec.sha256[:12]} vs {run.vocabulary.sha256[:12]} in its run "
                    f"manifest); {fix}.")
  vocab = data.vocabulary

  layout = {"pair_layout": run.pair_layout, "both_directions": run.bitext_both_directions}
  train_ds = data.dataset(feature_lengths=lengths, batch_size=batch_size, seed=seed + 1, **layout)
  counts = unigram_counts(train_ds.take(baseline_batches).as_numpy_iterator(), len(languages),
                          model.config.vocab_size, first_regular_id=run.vocabulary.specials.first_regular)
  top_token = counts.argmax(axis=1)

  eval_ds = data.dataset(feature_lengths=lengths, batch_size=batch_size, seed=seed,
                         split=split, shuffle=False, num_epochs=1, **layout)
  predict = jax.jit(model.masked_predictions)
  base_rng = jax.random.key(seed)
  n = len(languages) + 1
  correct, baseline, total = np.zeros(n), np.zeros(n), np.zeros(n)
  batches = 0
  for i, batch in enumerate(eval_ds.as_numpy_iterator()):
    if max_batches and i >= max_batches:
      break
    out = jax.device_get(predict(params, batch, jax.random.fold_in(base_rng, i)))
    w = out["weights"] > 0
    lang = out["lang_ids"][w]
    np.add.at(total, lang, 1)
    np.add.at(correct, lang, (out["predicted"] == out["targets"])[w])
    np.add.at(baseline, lang, (top_token[out["lang_ids"]] == out["targets"])[w])
    batches += 1
  if not batches:
    raise UserError(f"split {split!r} of {name!r} gave no full batch of {batch_size}; lower batch_size.")

  per_language = {}
  for lang_id, code in enumerate(languages, start=1):
    if total[lang_id]:
      per_language[code] = {
          "accuracy": correct[lang_id] / total[lang_id],
          "unigram_baseline": baseline[lang_id] / total[lang_id],
          "predictions": int(total[lang_id]),
          "most_frequent_token": vocab.decode([int(top_token[lang_id])]),
      }
  results = {
      "step": int(step), "task": name, "split": split, "batches": batches,
      "languages": per_language,
      "overall": {"accuracy": correct.sum() / max(total.sum(), 1),
                  "unigram_baseline": baseline.sum() / max(total.sum(), 1),
                  "predictions": int(total.sum())},
  }
  alignment = synthetic_alignment(model_dir, params, run, step)
  if alignment is not None:
    results["alignment"] = alignment
  if output and jax.process_index() == 0:
    write_atomically(os.path.join(model_dir, output), json.dumps(results, indent=2))
  return results


def format_table(results: Mapping[str, Any]) -> str:
  """A small text table of `evaluate`'s results."""
  lines = [f"held-out masked-token accuracy ({results['task']}, split={results['split']}, "
           f"step {results['step']})",
           f"  {'language':<10}{'accuracy':>10}{'unigram':>10}{'masked':>9}"]
  rows = list(results["languages"].items()) + [("all", results["overall"])]
  for code, r in rows:
    lines.append(f"  {code:<10}{100 * r['accuracy']:>9.1f}%{100 * r['unigram_baseline']:>9.1f}%"
                 f"{r['predictions']:>9d}")
  return "\n".join(lines)
