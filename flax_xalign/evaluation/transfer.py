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

* `featurize`: word-tokenised examples -> `<s> pieces </s>` rows and labels;
* `models.heads`: the tagging and classification heads;
* `finetune`: the fine-tuning loop, prediction and `evaluate`;
* `transfer_metrics`: the loss, macro F1 and BIO entity F1.

Paper hyperparameters (Table 11) are lr 2e-5, 10 epochs (POS/NER) or 5
(XNLI), batch 32, length 128 for 500k-step base models; `finetune`'s defaults
(lr 1e-3, warmup 10 %, linear decay, AdamW) suit the small demo models.

    model, params, meta, _ = mlm_eval.load_model("runs/grc_trans_inv")
    result = zero_shot_transfer((model, params, meta), vocabulary, task_name="pos",
                                train=transfer_data.greek_pos("train"),
                                test=transfer_data.greek_pos("test"), language=language,
                                natural_lang="grc", derived_lang="grc_inv", steps=300)
    result["sup"], result["zs"], result["delta"]
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from flax_xalign.data.specials import SpecialTokens
from flax_xalign.errors import UserError
from flax_xalign.evaluation.featurize import (LENGTH_MULTIPLE, EncodedWords, FeatureSet,
                                              Featurizer, Transliterate, encode_words,
                                              label_set_of, task_of)
from flax_xalign.evaluation.finetune import (BUCKET_MULTIPLE, GROUP_BATCHES, FinetunedModel,
                                             Log, batch_order, bucket_length,
                                             encoder_config_of, encoder_params, evaluate,
                                             finetune, injected_adamw)
from flax_xalign.evaluation.transfer_data import LabelledSentence, TaggedSentence, derive
from flax_xalign.evaluation.transfer_metrics import (bio_spans, default_metric, macro_f1,
                                                     span_f1, weighted_cross_entropy)
from flax_xalign.models.config import EncoderConfig
from flax_xalign.models.heads import TASKS, ClassificationHead, TaggingHead, make_head

__all__ = [
    "BUCKET_MULTIPLE", "ClassificationHead", "EncodedWords", "FeatureSet", "Featurizer",
    "FinetunedModel", "GROUP_BATCHES", "LENGTH_MULTIPLE", "TASKS", "TaggingHead",
    "Transliterate", "batch_order", "bio_spans", "bucket_length", "default_metric",
    "encode_words", "encoder_params", "evaluate", "finetune", "injected_adamw", "label_set_of",
    "macro_f1", "make_head", "span_f1", "task_of", "weighted_cross_entropy",
    "zero_shot_transfer"]


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
  return getattr(meta, "languages", None)  # `run_spec.RunSpec` (load_model's third item).


def zero_shot_transfer(model: str | tuple, vocabulary: Any, *, task_name: str,
                       train: Sequence[TaggedSentence | LabelledSentence],
                       test: Sequence[TaggedSentence | LabelledSentence], language: Any,
                       natural_lang: str | int | None = None,
                       derived_lang: str | int | None = None, steps: int | None = None,
                       epochs: float | None = None, batch_size: int = 32,
                       learning_rate: float = 1e-3, warmup_ratio: float = 0.1,
                       weight_decay: float = 0.01, max_length: int = 128, seed: int = 0,
                       group_by_length: bool = False,
                       label_set: Sequence[str] | None = None, metric: str | None = None,
                       eval_batch_size: int = 64, specials: SpecialTokens | None = None,
                       log: Log = print) -> dict[str, Any]:
  """SUP, ZS and Δ = SUP − ZS of one pretrained model on one task.

  Two fine-tunings with the same seed (same head init and batch order):
  natural train -> scored on the natural test ("natural") and on the derived
  test ("zs"); derived train -> scored on the derived test ("sup"). Derived
  data is `transfer_data.derive(...)` plus `language.transliterate_ids` on
  the subword ids when the language transliterates.

  Args:
    model: a MODEL_DIR, or `(model, params, meta)` / `load_model`'s 4-tuple;
      `meta` is a dict with "languages" or the run manifest (`.languages`),
      and may be None for a model without language embeddings.
    vocabulary: the natural-language vocabulary of the model.
    task_name: a name for the report.
    train, test: natural-language examples (tagging or classification).
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
    log: progress lines (None: silent).

  Returns:
    {"task", "language", "metric", "sup", "zs", "delta", "natural",
     "scores": {"sup"|"zs"|"natural": evaluate's dict}, "steps", "seconds"}.
  """
  start = time.perf_counter()
  if isinstance(model, str):
    from flax_xalign.evaluation.mlm_eval import load_model  # Orbax only when needed.
    model = load_model(model)
  network, params, meta = model[:3]
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
  featurizer = Featurizer(vocabulary, max_length=max_length, specials=specials)
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
