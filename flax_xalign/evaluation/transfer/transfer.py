"""Zero-shot transfer to a derived language: fine-tune, evaluate, SUP / ZS / Δ.

The ALIGN-MLM protocol (Tang, Deshpande & Narasimhan 2022, §4; Deshpande et
al. 2021): a model pretrained on a natural language L and a derived language
L' (`data.synthetic`) gets a task head and is fine-tuned, all parameters, on
one language and tested on L':

* ZS (zero-shot): fine-tune on natural-language training data, test on L';
* SUP (supervised): fine-tune on the derived training data, test on L';
* Δ = SUP − ZS (lower is better transfer); we also report natural → natural.

The pieces live in focused modules, re-exported here so that
`transfer.finetune`, `transfer.Featurizer`, `transfer.span_f1`, ... keep
working:

* `featurize`: word-tokenised examples -> `<s> pieces </s>` rows (sentence
  pairs in the run's pair layout) and labels;
* `models.heads`: the tagging and classification heads;
* `finetune`: the fine-tuning loop, prediction and `evaluate`;
* `transfer_metrics`: the loss, macro F1 and BIO entity F1.

Paper hyperparameters (Table 11) are lr 2e-5, 10 epochs (POS/NER) or 5
(XNLI), batch 32, length 128 for 500k-step base models; `finetune`'s defaults
(lr 1e-3, warmup 10 %, linear decay, AdamW) suit the small demo models.

    run = Run.open("runs/grc_trans_inv")          # from flax_xalign.runs import Run
    result = zero_shot_transfer(run, run.vocabulary().base, task_name="pos",
                                train=transfer_data.greek_pos("train"),
                                test=transfer_data.greek_pos("test"), language=language,
                                natural_lang="grc", derived_lang="grc_inv", steps=300)
    result["sup"], result["zs"], result["delta"]

Sentence-pair classification (XNLI, PAWS-X; `transfer_data.SentencePair`) runs
through the same harness: a pair is one row in the model's pair layout and its
label is predicted from the first `<s>`. Between natural languages (XNLI's
English train, another language's test) `cross_lingual_transfer` reports ZS
(source train -> target test), SUP (target train, e.g. XNLI's translate-train,
-> target test) and Δ; `pair_transfer_from_files` does it from users' TSV
files and a `runs.Run`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from flax_xalign.data.vocab.specials import SpecialTokens
from flax_xalign.errors import UserError
from flax_xalign.evaluation.transfer.featurize import (LENGTH_MULTIPLE, EncodedWords, FeatureSet,
                                              Featurizer, Transliterate, encode_words,
                                              label_set_of, task_of)
from flax_xalign.evaluation.transfer.finetune import (BUCKET_MULTIPLE, GROUP_BATCHES, FinetunedModel,
                                             Log, batch_order, bucket_length,
                                             encoder_config_of, encoder_params, evaluate,
                                             finetune, injected_adamw)
from flax_xalign.evaluation.transfer.transfer_data import (PAIR_TASKS, LabelledSentence, SentencePair,
                                                  TaggedSentence, derive, read_pair_tsv)
from flax_xalign.evaluation.transfer.transfer_metrics import (bio_spans, default_metric, macro_f1,
                                                     span_f1, weighted_cross_entropy)
from flax_xalign.models.config import EncoderConfig
from flax_xalign.models.heads import TASKS, ClassificationHead, TaggingHead, make_head

__all__ = [
    "BUCKET_MULTIPLE", "ClassificationHead", "EncodedWords", "FeatureSet", "Featurizer",
    "FinetunedModel", "GROUP_BATCHES", "LENGTH_MULTIPLE", "TASKS", "TaggingHead",
    "Transliterate", "batch_order", "bio_spans", "bucket_length", "default_metric",
    "encode_words", "encoder_params", "evaluate", "finetune", "injected_adamw", "label_set_of",
    "macro_f1", "make_head", "span_f1", "task_of", "weighted_cross_entropy",
    "zero_shot_transfer", "cross_lingual_transfer", "pair_transfer_from_files", "SentencePair",
    "PAIR_TASKS"]


def _language_id(config: EncoderConfig, languages: Sequence[str] | None,
                 lang: str | int | None, role: str) -> int:
  if not config.num_languages:
    return 1  # No language embeddings: the encoder ignores lang_ids.
  if isinstance(lang, int):
    return lang
  if lang is None or languages is None or lang not in languages:
    raise UserError(f"the model has language embeddings: give {role} as one of its languages "
                    f"{list(languages or [])} (or as an id).")
  return list(languages).index(lang) + 1


def _languages_of(meta: Any) -> Sequence[str] | None:
  """The language codes of a checkpoint's metadata: a dict, the run manifest, or None."""
  if meta is None:
    return None
  if isinstance(meta, Mapping):
    return meta.get("languages")
  return getattr(meta, "languages", None)  # `run_spec.RunSpec` (a `runs.Run`'s spec).


def _pair_layout_of(meta: Any, pair_layout: str | None) -> str:
  """The given pair layout, else the run manifest's (`RunSpec.pair_layout`), else "restart"."""
  if pair_layout is not None:
    return pair_layout
  if isinstance(meta, Mapping):
    return meta.get("pair_layout", "restart")
  return getattr(meta, "pair_layout", None) or "restart"


def _unpacked(model: Any) -> tuple[Any, Any, Any]:
  """(network, params, meta) of a `runs.Run` (its parameters at its step, read here), or of a tuple given as is."""
  if isinstance(model, (str, os.PathLike)):
    raise TypeError(f"pass a runs.Run (Run.open({os.fspath(model)!r})) or (network, params, meta), not a path")
  if not isinstance(model, (tuple, list)):  # A runs.Run.
    return model.model, model.params(), model.spec
  return model[0], model[1], model[2]


def zero_shot_transfer(model: Any, vocabulary: Any, *, task_name: str,
                       train: Sequence[TaggedSentence | LabelledSentence | SentencePair],
                       test: Sequence[TaggedSentence | LabelledSentence | SentencePair], language: Any,
                       natural_lang: str | int | None = None,
                       derived_lang: str | int | None = None, steps: int | None = None,
                       epochs: float | None = None, batch_size: int = 32,
                       learning_rate: float = 1e-3, warmup_ratio: float = 0.1,
                       weight_decay: float = 0.01, max_length: int = 128, seed: int = 0,
                       group_by_length: bool = False,
                       label_set: Sequence[str] | None = None, metric: str | None = None,
                       eval_batch_size: int = 64, specials: SpecialTokens | None = None,
                       pair_layout: str | None = None, log: Log = print) -> dict[str, Any]:
  """SUP, ZS and Δ = SUP − ZS of one pretrained model on one task.

  Two fine-tunings with the same seed (same head init and batch order):
  natural train -> scored on the natural test ("natural") and on the derived
  test ("zs"); derived train -> scored on the derived test ("sup"). Derived
  data is `transfer_data.derive(...)` plus `language.transliterate_ids` on
  the subword ids when the language transliterates.

  Args:
    model: a `runs.Run` (at the step to fine-tune from), or `(model, params, meta[, ...])`;
      `meta` is a dict with "languages" (and optionally "pair_layout") or the
      run manifest (`.languages`, `.pair_layout`), and may be None for a
      model without language embeddings.
    vocabulary: the natural-language vocabulary of the model.
    task_name: a name for the report.
    train, test: natural-language examples (tagging, classification or
      sentence pairs).
    language: the derived language (`data.synthetic.SyntheticLanguage`).
    natural_lang, derived_lang: codes in meta["languages"] (or ids); needed
      only when the model has language embeddings.
    steps, epochs, batch_size, learning_rate, warmup_ratio, weight_decay,
      max_length, seed, group_by_length: as in `finetune`.
    label_set: by default the sorted labels of train and test (natural and
      derived).
    metric: key of `evaluate`'s result to report; see `default_metric`.
    eval_batch_size: rows per prediction batch.
    specials: the vocabulary's special ids; None reads them from its
      SentencePiece model (see `featurize.Featurizer`).
    pair_layout: the layout of sentence pairs; default the run manifest's.
    log: progress lines (None: silent).

  Returns:
    {"task", "language", "metric", "sup", "zs", "delta", "natural",
     "scores": {"sup"|"zs"|"natural": evaluate's dict}, "steps", "seconds"}.
  """
  start = time.perf_counter()
  network, params, meta = _unpacked(model)
  config = encoder_config_of(network)
  languages = _languages_of(meta)
  natural_id = _language_id(config, languages, natural_lang, "natural_lang")
  derived_id = _language_id(config, languages, derived_lang, "derived_lang")
  transliterate = language.transliterate_ids if language.transliterates else None
  if transliterate is not None and language.derived_vocab_size > (config.vocab_size or 0):
    raise UserError(f"{language.name} needs {language.derived_vocab_size} token ids but the model "
                    f"has {config.vocab_size}; use a model pretrained on this language pair.")
  task = task_of(train)
  derived_train, derived_test = derive(train, language), derive(test, language)
  # Derived BIO tags are repaired after reordering, so take labels from both.
  label_set = tuple(label_set or label_set_of(train, test, derived_train, derived_test))
  metric = metric or default_metric(task, label_set)
  featurizer = Featurizer(vocabulary, max_length=max_length, specials=specials,
                          pair_layout=_pair_layout_of(meta, pair_layout))
  common = dict(task=task, label_set=label_set, steps=steps, epochs=epochs,
                batch_size=batch_size, learning_rate=learning_rate, warmup_ratio=warmup_ratio,
                weight_decay=weight_decay, seed=seed, group_by_length=group_by_length, log=log)

  natural = finetune(network, params, featurizer, train, language_id=natural_id,
                     name=f"{task_name} natural", **common)
  scores = {
      "natural": evaluate(natural, test, language_id=natural_id, batch_size=eval_batch_size),
      "zs": evaluate(natural, derived_test, language_id=derived_id, transliterate=transliterate,
                     batch_size=eval_batch_size)}
  del natural
  derived = finetune(network, params, featurizer, derived_train, language_id=derived_id,
                     transliterate=transliterate, name=f"{task_name} {language.name}", **common)
  scores["sup"] = evaluate(derived, derived_test, language_id=derived_id,
                           transliterate=transliterate, batch_size=eval_batch_size)
  sup, zs = scores["sup"][metric], scores["zs"][metric]
  return {"task": task_name, "language": language.name, "metric": metric, "sup": sup, "zs": zs,
          "delta": sup - zs, "natural": scores["natural"][metric], "scores": scores,
          "steps": len(derived.history["loss"]), "seconds": time.perf_counter() - start}


def cross_lingual_transfer(model: Any, vocabulary: Any, *, task_name: str,
                           source_train: Sequence[Any], target_test: Sequence[Any],
                           source_test: Sequence[Any] | None = None,
                           target_train: Sequence[Any] | None = None,
                           source_lang: str | int | None = None, target_lang: str | int | None = None,
                           steps: int | None = None, epochs: float | None = None, batch_size: int = 32,
                           learning_rate: float = 1e-3, warmup_ratio: float = 0.1,
                           weight_decay: float = 0.01, max_length: int = 128, seed: int = 0,
                           group_by_length: bool = False, label_set: Sequence[str] | None = None,
                           metric: str | None = None, eval_batch_size: int = 64,
                           specials: SpecialTokens | None = None, pair_layout: str | None = None,
                           log: Log = print) -> dict[str, Any]:
  """ZS, SUP and Δ = SUP − ZS between two natural languages (XNLI / PAWS-X style).

  One fine-tuning on `source_train` scored on `target_test` ("zs") and on
  `source_test` ("natural", when given); with `target_train` (XNLI's
  translate-train), a second fine-tuning with the same seed scored on
  `target_test` ("sup"), and Δ. Without it SUP and Δ are None.

  Args:
    model, vocabulary, task_name, steps ... pair_layout: as `zero_shot_transfer`.
    source_train, source_test, target_train, target_test: examples of one
      kind (tagging, sentence classification or sentence pairs).
    source_lang, target_lang: language codes (or ids) of the model; needed
      only when it has language embeddings.

  Returns:
    {"task", "source_lang", "target_lang", "metric", "zs", "sup", "delta",
     "natural", "scores": {"zs"|"sup"|"natural": evaluate's dict}, "steps",
     "seconds"}.
  """
  start = time.perf_counter()
  network, params, meta = _unpacked(model)
  config = encoder_config_of(network)
  languages = _languages_of(meta)
  source_id = _language_id(config, languages, source_lang, "source_lang")
  target_id = _language_id(config, languages, target_lang, "target_lang")
  sets = [s for s in (source_train, target_test, source_test, target_train) if s is not None]
  task = task_of(source_train)
  for examples in sets:
    if task_of(examples) != task:
      raise UserError(f"the training data is {task} but another set is {task_of(examples)}; give every "
                      "set as the same kind of example.")
  label_set = tuple(label_set or label_set_of(*sets))
  metric = metric or default_metric(task, label_set)
  featurizer = Featurizer(vocabulary, max_length=max_length, specials=specials,
                          pair_layout=_pair_layout_of(meta, pair_layout))
  common = {"task": task, "label_set": label_set, "steps": steps, "epochs": epochs,
            "batch_size": batch_size, "learning_rate": learning_rate, "warmup_ratio": warmup_ratio,
            "weight_decay": weight_decay, "seed": seed, "group_by_length": group_by_length, "log": log}
  source = finetune(network, params, featurizer, source_train, language_id=source_id,
                    name=f"{task_name} {source_lang or 'source'}", **common)
  scores = {"zs": evaluate(source, target_test, language_id=target_id, batch_size=eval_batch_size)}
  if source_test is not None:
    scores["natural"] = evaluate(source, source_test, language_id=source_id, batch_size=eval_batch_size)
  steps_done = len(source.history["loss"])
  del source
  if target_train is not None:
    target = finetune(network, params, featurizer, target_train, language_id=target_id,
                      name=f"{task_name} {target_lang or 'target'}", **common)
    scores["sup"] = evaluate(target, target_test, language_id=target_id, batch_size=eval_batch_size)
  zs = scores["zs"][metric]
  sup = scores["sup"][metric] if "sup" in scores else None
  return {"task": task_name, "source_lang": source_lang, "target_lang": target_lang, "metric": metric,
          "zs": zs, "sup": sup, "delta": None if sup is None else sup - zs,
          "natural": scores["natural"][metric] if "natural" in scores else None, "scores": scores,
          "steps": steps_done, "seconds": time.perf_counter() - start}


def pair_transfer_from_files(run: Any, *, task: str, train: str, test: str,
                             target_train: str | None = None, source_test: str | None = None,
                             source_lang: str | None = None, target_lang: str | None = None,
                             has_header: bool = True, steps: int | None = None,
                             epochs: float | None = 2.0, batch_size: int = 32,
                             learning_rate: float = 2e-5, max_length: int = 128, seed: int = 0,
                             output: str | None = None, log: Log = print) -> dict[str, Any]:
  """XNLI / PAWS-X zero-shot transfer of a run (trained or imported) at its step, from users' TSV files.

  Fine-tunes on `train` (the source language), scores `test` (the target
  language: ZS), `source_test` (natural) and, with `target_train`, the
  supervised target model (SUP) and Δ; see `cross_lingual_transfer`. The
  vocabulary, special ids and pair layout are the run's.

  Args:
    run: a `runs.Run`, opened at the step to fine-tune from.
    task: "xnli" (3 labels) or "pawsx" (2 labels), `transfer_data.PAIR_TASKS`.
    train, test, target_train, source_test: TSV paths (`read_pair_tsv`).
    source_lang, target_lang: the model's language codes of the two sides
      (needed only with language embeddings).
    has_header: False for headerless `premise<TAB>hypothesis<TAB>label` files.
    steps, epochs, batch_size, learning_rate, max_length, seed: fine-tuning
      (steps wins over epochs; lr 2e-5 as XTREME's XLM-R recipe).
    output: a file name inside the run's MODEL_DIR for the JSON result (None: none).

  Returns:
    `cross_lingual_transfer`'s dict plus "model_dir", "step", "label_set",
    "files", "pair_layout".
  """
  if task not in PAIR_TASKS:
    raise UserError(f"unknown sentence-pair task {task!r}; use one of {', '.join(PAIR_TASKS)}.")
  read = {name: None if path is None else read_pair_tsv(path, task=task, has_header=has_header)
          for name, path in (("train", train), ("test", test), ("target_train", target_train),
                             ("source_test", source_test))}
  spec, step = run.spec, run.step
  vocabulary = run.vocabulary()
  result = cross_lingual_transfer(
      run, vocabulary, task_name=task, source_train=read["train"],
      target_test=read["test"], source_test=read["source_test"], target_train=read["target_train"],
      source_lang=source_lang, target_lang=target_lang, steps=steps,
      epochs=None if steps is not None else epochs, batch_size=batch_size,
      learning_rate=learning_rate, max_length=max_length, seed=seed,
      label_set=PAIR_TASKS[task].labels, specials=spec.vocabulary.specials, log=log)
  result.update({"model_dir": run.path, "step": int(step), "label_set": list(PAIR_TASKS[task].labels),
                 "pair_layout": spec.pair_layout,
                 "files": {"train": train, "test": test, "target_train": target_train,
                           "source_test": source_test}})
  if log is not None:
    parts = [f"ZS {100 * result['zs']:.1f}"]
    if result["sup"] is not None:
      parts += [f"SUP {100 * result['sup']:.1f}", f"Δ {100 * result['delta']:+.1f}"]
    if result["natural"] is not None:
      parts.append(f"natural {100 * result['natural']:.1f}")
    log(f"{task} {result['metric']}: " + ", ".join(parts) + f" (chance {100 / len(PAIR_TASKS[task].labels):.1f})")
  if output:
    from flax_xalign.fileio import write_atomically

    write_atomically(run.dir.file(output), json.dumps(result, indent=2) + "\n")
  return result
