"""SUP / ZS / Δ of a pretrained model, and the names `transfer` re-exports.

Models are tiny and randomly initialised; one encoder config (vocabulary
doubled, as a transliterating language needs; see conftest.py) serves every
transfer test, so the tagging train step compiles once per session.
"""

import types

import pytest

from flax_xalign.data.vocab.specials import special_tokens_of
from flax_xalign.errors import UserError
from flax_xalign.evaluation.transfer import featurize
from flax_xalign.evaluation.transfer import finetune
from flax_xalign.evaluation.transfer import transfer
from flax_xalign.evaluation.transfer import transfer_metrics
from flax_xalign.models import heads
from tests.evaluation.transfer_testlib import (BATCH, LENGTH, LR, POS, STEPS, FakeLanguage,
                                               WordVocabulary, tagged)


def test_zero_shot_transfer_reports_sup_zs_delta(transfer_model, spm_vocabulary):
  from flax_xalign.data.transforms.synthetic import SyntheticLanguage

  encoder, params = transfer_model
  vocab_size = spm_vocabulary.get_piece_size()
  train, test = tagged(200, seed=1), tagged(40, seed=4)
  options = dict(task_name="toy_pos", train=train, test=test, steps=STEPS, batch_size=BATCH,
                 max_length=LENGTH, learning_rate=LR, seed=0, log=None)
  model = (encoder, params, {"languages": ["en", "en_trans"]})
  result = transfer.zero_shot_transfer(
      model, spm_vocabulary, language=SyntheticLanguage(("trans", "inv"), vocab_size),
      natural_lang="en", derived_lang="en_trans", **options)
  assert result["metric"] == "accuracy" and result["language"] == "trans_inv"
  assert result["sup"] > 0.9 and result["natural"] > 0.9
  assert result["scores"]["zs"]["count"] == sum(len(s.words) for s in test)
  # An identity language with the same language id: both fine-tunings see the
  # same batches, so SUP and ZS (and natural) coincide.
  same = transfer.zero_shot_transfer(model, spm_vocabulary, language=FakeLanguage(vocab_size),
                                     natural_lang="en", derived_lang="en", **options)
  assert same["sup"] == same["zs"] == same["natural"] == result["natural"]
  assert same["delta"] == 0.0
  with pytest.raises(UserError, match="language embeddings"):
    transfer.zero_shot_transfer(model, spm_vocabulary, language=FakeLanguage(vocab_size),
                                natural_lang="grc", derived_lang="en", **options)


def test_sup_zs_delta_come_from_the_right_fine_tuning_and_test_set(monkeypatch, spm_vocabulary):
  """Stubbed fine-tuning and scoring: each (train language, test language) has a known accuracy."""
  from flax_xalign.data.transforms.synthetic import SyntheticLanguage

  vocab_size = spm_vocabulary.get_piece_size()
  natural_test = tagged(5, seed=4)
  accuracy = {("natural", "natural"): 0.95, ("natural", "derived"): 0.55, ("derived", "derived"): 0.875,
              ("derived", "natural"): 0.1}

  def fake_finetune(network, params, featurizer, train, *, language_id, **kwargs):
    return types.SimpleNamespace(trained_on="natural" if language_id == 1 else "derived",
                                 history={"loss": [0.0] * 3})

  def fake_evaluate(model, test, *, language_id, batch_size, transliterate=None):
    tested_on = "natural" if list(test) == natural_test else "derived"
    assert (language_id == 1) == (tested_on == "natural")
    return {"accuracy": accuracy[model.trained_on, tested_on], "count": 1}

  monkeypatch.setattr(transfer, "finetune", fake_finetune)
  monkeypatch.setattr(transfer, "evaluate", fake_evaluate)
  config = types.SimpleNamespace(num_languages=2, vocab_size=2 * vocab_size)
  result = transfer.zero_shot_transfer(
      (types.SimpleNamespace(config=config), None, {"languages": ["en", "en_trans"]}), spm_vocabulary,
      task_name="toy_pos", train=tagged(5, seed=1), test=natural_test, max_length=LENGTH,
      language=SyntheticLanguage(("trans", "inv"), vocab_size), natural_lang="en", derived_lang="en_trans",
      log=None)
  # SUP: derived train -> derived test; ZS: natural train -> derived test; Δ = 0.875 - 0.55 = 0.325.
  assert (result["sup"], result["zs"], result["natural"]) == (0.875, 0.55, 0.95)
  assert result["delta"] == pytest.approx(0.325)
  assert result["steps"] == 3


def test_zero_shot_transfer_takes_the_special_ids_and_a_run_manifest(transfer_model, spm_vocabulary):
  from flax_xalign.data.transforms.synthetic import SyntheticLanguage

  encoder, params = transfer_model
  # The same pieces as the SentencePiece model, without a model to read special ids from.
  words = WordVocabulary({w: spm_vocabulary.encode(w) for w in POS})
  options = dict(task_name="toy_pos", train=tagged(200, seed=1), test=tagged(40, seed=4),
                 steps=STEPS, batch_size=BATCH, max_length=LENGTH, learning_rate=LR, seed=0,
                 log=None, natural_lang="en", derived_lang="en_trans",
                 language=SyntheticLanguage(("trans", "inv"), spm_vocabulary.get_piece_size()))
  model = (encoder, params, {"languages": ["en", "en_trans"]})
  with pytest.raises(UserError, match="specials="):
    transfer.zero_shot_transfer(model, words, **options)
  # A longer tuple, with the run manifest (`.languages`) in place of a meta dict.
  loaded = (encoder, params, types.SimpleNamespace(languages=("en", "en_trans")), 7)
  given = transfer.zero_shot_transfer(loaded, words, specials=special_tokens_of(spm_vocabulary),
                                      **options)
  read = transfer.zero_shot_transfer(model, spm_vocabulary, **options)
  assert given["scores"] == read["scores"]


def test_transfer_reexports_the_split_modules():
  modules = {featurize: ("EncodedWords", "encode_words", "FeatureSet", "Featurizer", "task_of",
                         "label_set_of", "LENGTH_MULTIPLE"),
             heads: ("TaggingHead", "ClassificationHead", "make_head", "TASKS"),
             finetune: ("FinetunedModel", "finetune", "evaluate", "batch_order",
                        "bucket_length", "encoder_params", "injected_adamw"),
             transfer_metrics: ("weighted_cross_entropy", "macro_f1", "bio_spans", "span_f1",
                                "default_metric")}
  for module, names in modules.items():
    for name in names:
      assert getattr(transfer, name) is getattr(module, name), name
      assert name in transfer.__all__
  assert not hasattr(transfer, "PAD_ID") and not hasattr(transfer, "NUM_SPECIAL_TOKENS")
