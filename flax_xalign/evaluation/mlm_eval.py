"""Held-out masked-token accuracy per language, next to a unigram baseline.

The baseline always predicts the language's most frequent training token (over
a sample of the training stream): an MLM that beats it has learned context, not
just frequencies. Masking uses fixed RNGs, so two evaluations of one checkpoint
agree exactly. Everything needed (model size, task, languages) is read from the
checkpoint's metadata, so `evaluate(model_dir=...)` is enough from a notebook.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

import flax.linen as nn
import jax
import numpy as np

from flax_xalign.errors import UserError
from flax_xalign.models.config import EncoderConfig
from flax_xalign.models.encoder import Encoder
from flax_xalign.objectives.pretraining import MaskingConfig, PretrainingModel
from flax_xalign.training import partitioning
from flax_xalign.training.checkpoints import Checkpointer, CheckpointConfig, restore_params


def load_model(model_dir: str, *, num_partitions: int = 1):
  """(model, params, meta, step) from the latest checkpoint in `model_dir`."""
  # Checked first: the manager would create checkpoints/ in a mistyped path.
  step = None
  if os.path.isdir(os.path.join(model_dir, "checkpoints")):
    checkpointer = Checkpointer(model_dir, CheckpointConfig(async_save=False))
    step = checkpointer.latest_step()
  if step is None:
    raise UserError(f"{model_dir} has no checkpoint to evaluate; train first (python -m flax_xalign.train).")
  meta = checkpointer.read_meta(step)
  checkpointer.close()
  encoder = EncoderConfig(**meta["model"])
  # Evaluation reads the plain masked forward pass only: objectives that need
  # assets (dictionaries) or change the corruption (DICT-MLM) are not rebuilt.
  model = PretrainingModel(encoder=Encoder(encoder), objectives={"mlm": 1.0})
  partitioner = partitioning.Partitioner(mesh=partitioning.make_mesh(num_partitions))
  boxed = jax.eval_shape(lambda k: model.init(k, batch=1, length=8), jax.random.key(0))
  shardings = partitioner.shardings_for(boxed)
  abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                          nn.meta.unbox(boxed), shardings)
  params = restore_params(model_dir, abstract, step=step)
  return model, params, meta, step


def register_synthetic_tasks(meta: Mapping[str, Any]) -> None:
  """Re-registers the synthetic-language tasks a checkpoint was trained on."""
  spec = meta.get("synthetic_tasks")
  if spec:
    from flax_xalign.tasks.synthetic import SyntheticTasks

    SyntheticTasks(**spec).register()


def synthetic_alignment(model_dir: str, params: Any, meta: Mapping[str, Any]) -> dict[str, Any] | None:
  """ALIGN-MLM alignment score (all / leak-free) of a synthetic-language run, else None."""
  spec = meta.get("synthetic_tasks")
  if not spec:
    return None
  from flax_xalign.data import dictionary as dictionary_lib
  from flax_xalign.evaluation.alignment_score import alignment_score
  from flax_xalign.tasks.synthetic import SyntheticTasks

  language = SyntheticTasks(**spec).language()
  if not language.transliterates:
    return None
  path = os.path.join(model_dir, dictionary_lib.FILENAME)
  dictionary = dictionary_lib.load(path) if os.path.exists(path) else None
  return alignment_score(np.asarray(jax.device_get(params["token_embed"]["embedding"])), language.id_map(),
                         dictionary=dictionary)


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
  """
  from flax_xalign.training.pretrain import build_data
  from flax_xalign.tasks import get_vocabulary

  model, params, meta, step = load_model(model_dir, num_partitions=num_partitions)
  register_synthetic_tasks(meta)
  name = mixture_or_task_name or meta["task"]
  lengths = meta["task_feature_lengths"]
  languages = list(meta["languages"])
  vocab = get_vocabulary(name)
  masking: MaskingConfig = model.masking

  train_ds, _ = build_data(name, feature_lengths=lengths, batch_size=batch_size, seed=seed + 1)
  counts = unigram_counts(train_ds.take(baseline_batches).as_numpy_iterator(), len(languages),
                          model.config.vocab_size, first_regular_id=masking.num_special_tokens)
  top_token = counts.argmax(axis=1)

  eval_ds, _ = build_data(name, feature_lengths=lengths, batch_size=batch_size, seed=seed,
                          split=split, shuffle=False, num_epochs=1)
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
  alignment = synthetic_alignment(model_dir, params, meta)
  if alignment is not None:
    results["alignment"] = alignment
  if output and jax.process_index() == 0:
    path = os.path.join(model_dir, output)
    with open(path + ".tmp", "w") as f:
      json.dump(results, f, indent=2)
    os.replace(path + ".tmp", path)
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
