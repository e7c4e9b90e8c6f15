"""Vocabulary trimming: segmentation of the corpus, hidden states and logits are unchanged."""

import flax.linen as nn
import jax
import numpy as np
import pytest
import seqio
import sentencepiece as spm

from flax_xalign.cli import trim as trim_cli
from flax_xalign.errors import UserError
from flax_xalign.interop import trim
from flax_xalign.interop.model_dir import write_model_dir
from flax_xalign.runs import Run
from flax_xalign.models.encoder import Encoder
from flax_xalign.objectives.model import PretrainingModel
from tests import testlib


@pytest.fixture(scope="module")
def big_model(tmp_path_factory, tiny_corpus):
  """An 'imported' model whose unigram vocabulary was trained on more text than tiny_en uses."""
  from flax_xalign.data.vocab import sentencepiece as vocab
  import random

  root = tmp_path_factory.mktemp("trim")
  rng = random.Random(3)
  words = ["".join(rng.choice("zqxjkvwyfgh") for _ in range(rng.randint(3, 7))) for _ in range(400)]
  extra = [" ".join(rng.choice(words) for _ in range(6)) for _ in range(600)]
  sentences = [line.strip() for line in open(tiny_corpus["files"][("en", "train")], encoding="utf-8")] + extra
  path = vocab.train_sentencepiece(sentences, vocab_size=120, model_path=root / "big.model", model_type="unigram")
  vocabulary = seqio.SentencePieceVocabulary(str(path), extra_ids=0)
  config = testlib.tiny_encoder_config(vocab_size=120, num_languages=0, dropout_rate=0.0)
  model = PretrainingModel(encoder=Encoder(config), objectives={"mlm": 1.0})
  params = nn.meta.unbox(model.init(jax.random.key(9), batch=1, length=8))
  params["mlm_head"]["output_bias"] = jax.random.normal(jax.random.key(1), (120,))  # Non-trivial bias.
  model_dir = root / "model"
  write_model_dir(str(model_dir), config=config, params=params, vocabulary=vocabulary, languages=["en"],
                  notice="weights licence")
  return model_dir


def _encode(model, params, ids):
  ids = np.asarray([ids], np.int32)
  n = ids.shape[1]
  out = model.encoder.apply({"params": params}, ids, lang_ids=None, positions=np.arange(n)[None],
                            segment_ids=np.ones_like(ids), deterministic=True)
  logits = model.encoder.apply({"params": params}, out.hidden, method=Encoder.mlm_logits)
  return np.asarray(out.hidden[0]), np.asarray(logits[0])


def test_trim_keeps_segmentation_states_and_logits(big_model, tmp_path, tiny_corpus):
  output = tmp_path / "trimmed"
  summary = trim.trim_model_dir(str(big_model), "tiny_en", str(output), verbose=False)
  assert 5 < summary["pieces_after"] < summary["pieces_before"] == 120
  old, new = Run.open(str(big_model)), Run.open(str(output))
  old_model, old_params, old_run = old.model, old.params(), old.spec
  new_model, new_params, new_run = new.model, new.params(), new.spec
  assert new_run.model.vocab_size == summary["pieces_after"]
  assert new_run.vocabulary.specials == old_run.vocabulary.specials.__class__(
      **{**old_run.vocabulary.specials.as_dict(), "end_regular": None})  # Same specials; ids below 5 kept.
  assert (output / "NOTICE").read_text() == "weights licence"
  old_vocab, new_vocab = old.vocabulary(), new.vocabulary()
  old_sp = spm.SentencePieceProcessor(model_proto=old_vocab.sp_model)
  keep = np.asarray([old_sp.piece_to_id(new_vocab.tokenizer.id_to_piece(i)) for i in range(new_vocab.vocab_size)])
  for text in list(trim.corpus_texts("tiny_en"))[:20]:
    old_ids, new_ids = old_vocab.encode(text), new_vocab.encode(text)
    np.testing.assert_array_equal(keep[new_ids], old_ids)
    old_hidden, old_logits = _encode(old_model, old_params, old_ids)
    new_hidden, new_logits = _encode(new_model, new_params, new_ids)
    np.testing.assert_array_equal(new_hidden, old_hidden)
    np.testing.assert_allclose(new_logits, old_logits[:, keep], rtol=1e-6, atol=1e-6)
  # Text the corpus never used is absent.
  pieces = [new_vocab.tokenizer.id_to_piece(i) for i in range(new_vocab.vocab_size)]
  corpus_letters = set(open(tiny_corpus["files"][("en", "train")], encoding="utf-8").read())
  foreign = set("zqxjkvwyfgh") - corpus_letters  # Letters only the extra words use.
  assert foreign and not foreign & set("".join(p for p in pieces if not p.startswith("<")))


def test_bpe_models_and_unknown_tasks_are_refused(big_model, tmp_path, tiny_corpus):
  bpe = open(tiny_corpus["vocab"], "rb").read()  # The tiny corpus vocabulary is BPE.
  with pytest.raises(UserError, match="only unigram"):
    trim.kept_ids(bpe, ["the house"])
  with pytest.raises(UserError, match="Unknown task"):
    trim.trim_model_dir(str(big_model), "no_such_task", str(tmp_path / "x"), verbose=False)
  assert trim_cli.main([f"--checkpoint={big_model}", "--task=no_such_task", f"--output={tmp_path / 'y'}"]) == 2


def test_normalised_forms_and_import_then_trim(big_model, tmp_path, tiny_corpus):
  import shutil

  from flax_xalign.tasks import user

  path = tmp_path / "greek.txt"
  path.write_text("Ἐν ἀρχῇ ἦν ὁ λόγος\n", encoding="utf-8")
  user.TextTask(name="trim_greek", files={"train": str(path)}, lang="grc",
                vocabulary_path=tiny_corpus["vocab"]).register()
  assert list(trim.corpus_texts("trim_greek")) == ["Ἐν ἀρχῇ ἦν ὁ λόγος"]
  assert list(trim.corpus_texts("trim_greek", normalizers=("nfd_strip_marks",))) == [
      "Ἐν ἀρχῇ ἦν ὁ λόγος", "Εν αρχη ην ο λογος"]
  # --trim_vocab_to: the import goes to a scratch dir beside the output, which is removed afterwards.
  out = tmp_path / "out" / "trimmed"
  summary = trim.import_trimmed(lambda scratch: shutil.copytree(big_model, scratch), str(out), "tiny_en")
  assert summary["pieces_after"] < 120 and sorted(p.name for p in out.parent.iterdir()) == ["trimmed"]
  with pytest.raises(UserError, match="Unknown task"):
    trim.import_trimmed(lambda scratch: pytest.fail("imported before the task was checked"), str(out), "nope")
