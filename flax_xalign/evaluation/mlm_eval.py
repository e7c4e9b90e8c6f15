"""Held-out masked-token accuracy per language, next to a unigram baseline.

The baseline always predicts the language's most frequent training token (over
a sample of the training stream): an MLM that beats it has learned context, not
just frequencies. Masking uses fixed RNGs, so two evaluations of one checkpoint
agree exactly. Everything needed (model size, task, languages) is read from the
run manifest of the step the `runs.Run` was opened at, so
`evaluate(Run.open(model_dir, step=k))` is enough from a notebook and scores
step k. A run trained on the user's own files re-registers its tasks from the
manifest (`Run.register_tasks`); `relocate` points it at data that moved since
training.
"""

from __future__ import annotations

import itertools
import json
import os
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from flax_xalign import fileio
from flax_xalign.errors import UserError
from flax_xalign.evaluation import eval_json
from flax_xalign.fileio import write_atomically
from flax_xalign.run_dir import EVAL_JSON, check_model_dir


def unigram_counts(batches, num_languages: int, vocab_size: int, *, first_regular_id: int) -> np.ndarray:
  """[num_languages + 1, vocab] counts of maskable tokens per language id."""
  counts = np.zeros((num_languages + 1, vocab_size), np.int64)
  for batch in batches:
    tokens, langs = np.asarray(batch["tokens"]), np.asarray(batch["lang_ids"])
    keep = tokens >= first_regular_id
    np.add.at(counts, (langs[keep], tokens[keep]), 1)
  return counts


def evaluate(
    run: Any,
    *,
    split: str = "test",
    mixture_or_task_name: str | None = None,
    batch_size: int = 32,
    max_batches: int = 0,
    baseline_batches: int = 100,
    seed: int = 0,
    num_partitions: int = 1,
    output: str | None = EVAL_JSON,
    relocate: Mapping[str, str] | None = None,
    import_modules: Sequence[str] = (),
    user_tasks: Sequence[Any] = (),
    data: str = "seqio",
) -> dict[str, Any]:
  """Masked-token accuracy per language on `split` at the run's step, written to MODEL_DIR/eval.json.

  Args:
    run: a `runs.Run`, opened at the step to score.
    split: held-out split to score ("validation" or "test").
    mixture_or_task_name: defaults to the task the checkpoint was trained on.
    batch_size: evaluation batch size.
    max_batches: 0 scores the whole split.
    baseline_batches: training batches sampled for the unigram baseline.
    seed: masking seed (fixed: evaluations are repeatable).
    num_partitions: 'model' mesh axis size.
    output: file name inside MODEL_DIR (None: do not write); the default,
      eval.json, is eval.<split>.json for a split other than validation.
    relocate: recorded data folder -> its new place, for a run trained on
      files that have moved since (the run manifest records absolute paths),
      e.g. {"/old/data": "/new/data"}.
    import_modules: modules to import first, for tasks registered in Python
      that the run manifest could not record (a script's __main__).
    user_tasks: TextTask / TsvBitextTask / AlphaMixture specs to register
      first (e.g. to evaluate on another task).
    data: "seqio" (the task registry) or "cache:DIR", a packed cache of the
      run's task (`xalign cache`): `split` is read from
      DIR/<split> and the unigram baseline from DIR/train, without seqio.
  """
  from flax_xalign.evaluation.alignment_score import run_alignment
  from flax_xalign.training import validate

  if output:  # Before any work: only where the report goes must be writable (a read-only run may be scored
    # into a file elsewhere, `output` an absolute path).
    target = run.dir.file(output_file(output, split))
    if fileio.lies_in(target, run.path):
      check_model_dir(run.path, writable=True)
    else:
      fileio.check_output_file(target, setting="evaluate.output")
    eval_json.check_layout(run.dir.file(output_file(output, split)), eval_json.MLM, setting="evaluate.output")
  for value, setting, least, example in ((batch_size, "evaluate.batch_size", 1, 32),
                                         (max_batches, "evaluate.max_batches", 0, 0),
                                         (baseline_batches, "evaluate.baseline_batches", 1, 100),
                                         (num_partitions, "evaluate.num_partitions", 1, 1)):
    validate.check_integer(value, setting, least=least, example=example)
  model, spec, step = run.model, run.spec, run.step
  params = run.params(num_partitions=num_partitions)
  name = mixture_or_task_name or spec.task
  vocab, top_token, eval_batches = held_out_batches(
      run, split=split, name=mixture_or_task_name, batch_size=batch_size, baseline_batches=baseline_batches,
      seed=seed, data=data, relocate=relocate, import_modules=import_modules, user_tasks=user_tasks)
  languages = list(spec.languages)
  scores = masked_accuracy(model, params, eval_batches, top_token, languages=languages, seed=seed,
                           max_batches=max_batches)
  if not scores["batches"]:
    raise UserError(f"split {split!r} of {name!r} gave no full batch of {batch_size}; lower batch_size.")
  for lang_id, code in enumerate(languages, start=1):
    if code in scores["languages"]:
      scores["languages"][code]["most_frequent_token"] = vocab.decode([int(top_token[lang_id])])
  results = {"step": int(step), "task": name, "split": split, **scores}
  alignment = run_alignment(run, params)
  if alignment is not None:
    results["alignment"] = alignment
  if output and jax.process_index() == 0:
    write_atomically(run.dir.file(output_file(output, split)), json.dumps(results, indent=2))
  return results


def held_out_batches(run: Any, *, split: str, name: str | None = None, batch_size: int = 32,
                     baseline_batches: int = 100, seed: int = 0, data: str = "seqio",
                     feature_lengths: Mapping[str, int] | None = None, **task_options: Any):
  """(vocabulary, top_token [languages + 1], iterator of `split`'s feature batches) as `evaluate` scores them.

  `top_token` is each language id's most frequent maskable token over `baseline_batches` training batches
  (the unigram baseline); the held-out batches come in order, one epoch, laid out as the run trained
  (`feature_lengths` replaces the run's task_feature_lengths, e.g. for an import that recorded none).
  `task_options` go to `run.task_data` (relocate, import_modules, user_tasks).
  """
  spec = run.spec
  source = run.task_data(split, name=name, data=data, **task_options)
  lengths = dict(feature_lengths or spec.task_feature_lengths)
  layout = {"pair_layout": spec.pair_layout, "both_directions": spec.bitext_both_directions}
  train_batches = source.batches(feature_lengths=lengths, batch_size=batch_size, seed=seed + 1, **layout)
  counts = unigram_counts(itertools.islice(train_batches, baseline_batches), len(spec.languages),
                          run.model.config.vocab_size, first_regular_id=spec.vocabulary.specials.first_regular)
  eval_batches = source.batches(feature_lengths=lengths, batch_size=batch_size, seed=seed,
                                split=split, shuffle=False, num_epochs=1, **layout)
  return source.vocabulary, counts.argmax(axis=1), eval_batches


def masked_accuracy(model: Any, params: Any, batches, top_token: np.ndarray, *, languages: Sequence[str],
                    seed: int = 0, max_batches: int = 0) -> dict[str, Any]:
  """Masked-token accuracy of `model` over `batches` (feature dicts), per language and overall.

  Batch i is masked with `fold_in(key(seed), i)`, so the same batches in the same order give the same
  numbers wherever they were read from (the task registry, a packed cache, a file of rows). `top_token`
  [len(languages) + 1] is each language id's most frequent training token (the unigram baseline).

  Returns:
    {"batches", "languages": {code: {"accuracy", "unigram_baseline", "predictions"}}, "overall": {...}}.
  """
  predict = jax.jit(model.masked_predictions)
  base_rng = jax.random.key(seed)
  n = len(languages) + 1
  correct, baseline, total = np.zeros(n), np.zeros(n), np.zeros(n)
  count = 0
  for i, batch in enumerate(batches):
    if max_batches and i >= max_batches:
      break
    out = jax.device_get(predict(params, batch, jax.random.fold_in(base_rng, i)))
    w = out["weights"] > 0
    lang = out["lang_ids"][w]
    np.add.at(total, lang, 1)
    np.add.at(correct, lang, (out["predicted"] == out["targets"])[w])
    np.add.at(baseline, lang, (top_token[out["lang_ids"]] == out["targets"])[w])
    count += 1
  per_language = {}
  for lang_id, code in enumerate(languages, start=1):
    if total[lang_id]:
      per_language[code] = {"accuracy": correct[lang_id] / total[lang_id],
                            "unigram_baseline": baseline[lang_id] / total[lang_id],
                            "predictions": int(total[lang_id])}
  return {"batches": count, "languages": per_language,
          "overall": {"accuracy": correct.sum() / max(total.sum(), 1),
                      "unigram_baseline": baseline.sum() / max(total.sum(), 1),
                      "predictions": int(total.sum())}}


def output_file(output: str, split: str) -> str:
  """eval.json for the validation split, eval.<split>.json for another: two splits never overwrite one file."""
  if output != EVAL_JSON or split == "validation":
    return output
  stem, extension = os.path.splitext(EVAL_JSON)
  return f"{stem}.{split}{extension}"


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
