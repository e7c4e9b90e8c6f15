"""An imported model written as a MODEL_DIR is accepted by eval, the aligner and warm start."""

import json

import flax.linen as nn
import jax
import numpy as np
import pytest

from flax_xalign.errors import UserError
from flax_xalign.evaluation.word_alignment import word_align
from flax_xalign.interop.model_dir import write_model_dir
from flax_xalign.models.encoder import Encoder
from flax_xalign.objectives.model import PretrainingModel
from flax_xalign.runs import Run
from flax_xalign.runs.checkpoints import read_run_spec
from flax_xalign.training.checkpoints import CheckpointConfig
from flax_xalign.training.pretrain import pretrain
from tests.testlib import tiny_encoder_config


@pytest.fixture(scope="module")
def imported(tmp_path_factory, tiny_corpus):
  from flax_xalign.data.vocab import sentencepiece as vocab
  vocabulary = vocab.load_vocabulary(tiny_corpus["vocab"])
  config = tiny_encoder_config(vocab_size=vocabulary.vocab_size, num_languages=0, dropout_rate=0.0)
  model = PretrainingModel(encoder=Encoder(config), objectives={"mlm": 1.0})
  params = nn.meta.unbox(model.init(jax.random.key(4), batch=1, length=8))
  output = tmp_path_factory.mktemp("import") / "model"
  run = write_model_dir(str(output), config=config, params=params, vocabulary=vocabulary, languages=["en", "de"],
                        language_pairs=[("de", "en")], origin={"format": "test"}, notice="licence text")
  return output, params, run


def test_layout_manifest_and_params_round_trip(imported):
  output, params, run = imported
  assert sorted(p.name for p in output.iterdir()) == ["NOTICE", "checkpoints", "model.gin", "origin.json",
                                                      "vocabulary.model"]
  assert "EncoderConfig.embed_dim = 24\n" in (output / "model.gin").read_text()
  assert json.loads((output / "origin.json").read_text()) == {"format": "test"}
  step, saved, fingerprints = read_run_spec(str(output))
  assert step == 0 and saved == run and saved.objectives == {} and saved.languages == ("de", "en")
  assert fingerprints == run.assets
  loaded = Run.open(str(output)).params()
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(loaded)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_aligner_and_warm_start_accept_it_and_resuming_it_is_refused(imported, tmp_path, tiny_corpus):
  output, _, _ = imported
  aligner, _, _ = word_align.load_aligner(Run.open(output), batch_size=2)
  assert (aligner.src_lang, aligner.tgt_lang) == ("de", "en")
  assert len(aligner.align([("das haus".split(), "the house".split())], layer=1)) == 1
  kwargs = dict(mixture_or_task_name="tiny_mix", task_feature_lengths={"tokens": 19}, batch_size=6, train_steps=2,
                encoder=tiny_encoder_config(num_languages=0, dropout_rate=0.0), objectives={"mlm": 1.0},
                checkpoint=CheckpointConfig(every_steps=2, async_save=False), log_every=1, seed=1)
  with pytest.raises(UserError, match="holds an imported model"):
    pretrain(model_dir=str(output), **kwargs)
  result = pretrain(model_dir=str(tmp_path / "continued"), init_from_checkpoint=str(output), **kwargs)
  assert result.last_step == 2
  # Another architecture (here only the LayerNorm epsilon) is refused, pointing at model.gin.
  other = dict(kwargs, encoder=kwargs["encoder"].replace(layer_norm_epsilon=1e-12))
  with pytest.raises(UserError, match=r"another architecture \(layer_norm_epsilon.*model\.gin"):
    pretrain(model_dir=str(tmp_path / "other"), init_from_checkpoint=str(output), **other)
  assert not (tmp_path / "other").exists()
  with pytest.raises(UserError, match="already holds checkpoints"):
    write_model_dir(str(output), config=aligner.config, params={}, vocabulary=aligner.vocabulary)
