"""Tests for flax_xalign.data.vocab.sentencepiece (SentencePiece training and caching)."""

import json

import pytest
import sentencepiece as spm

from flax_xalign import errors
from flax_xalign.data.vocab import specials
from flax_xalign.data.vocab import sentencepiece as vocab
from tests.conftest import tiny_sentences


def test_special_ids_and_vocab_size(toy_corpus):
  _, model = toy_corpus
  v = vocab.load_vocabulary(model)
  assert v.vocab_size == 61 and v.extra_ids == 0
  assert (v.pad_id, v.eos_id, v.unk_id, v.bos_id) == (0, 1, 2, 3)
  pieces = [v.tokenizer.id_to_piece(i) for i in range(vocab.NUM_SPECIAL_TOKENS)]
  assert pieces == ["<pad>", "</s>", "<unk>", "<s>", "<mask>"]
  # <mask> is a user-defined piece of the model (SentencePiece itself reads it from text) ...
  assert vocab.MASK_ID in spm.SentencePieceProcessor(model_file=str(model)).encode("the cat <mask> sat")
  # ... but text is text: our encoders spell it out (issue 14, item 12).
  ids = v.encode("the cat <mask> sat")
  assert vocab.MASK_ID not in ids and min(ids) > 0
  assert v.decode(v.encode("the cat sat")) == "the cat sat"
  assert specials.special_tokens_of(v) == specials.PROJECT  # What we train.


def test_training_is_deterministic(tmp_path, toy_corpus):
  _, model = toy_corpus
  again = vocab.train_sentencepiece(
      tiny_sentences("en", 300, 1) + tiny_sentences("de", 200, 2),
      vocab_size=61, model_path=tmp_path / "again.model")
  assert again.read_bytes() == model.read_bytes()


def _plain_model(prefix, **options):
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(tiny_sentences("en", 100)), model_prefix=prefix,
      vocab_size=40, minloglevel=2, num_threads=1, **options)
  return f"{prefix}.model"


def test_any_layout_with_the_five_specials_loads(tmp_path):
  path = _plain_model(tmp_path / "xlmr_ids", bos_id=0, pad_id=1, eos_id=2,
                      unk_id=3, user_defined_symbols=["<mask>"])
  v = vocab.load_vocabulary(path)
  assert v.vocab_size == 40
  assert specials.special_tokens_of(v) == specials.SpecialTokens(
      bos=0, pad=1, eos=2, unk=3, mask=4, first_regular=5)
  assert vocab.check_special_ids(v.tokenizer, path) == specials.special_tokens_of(v)
  assert 4 in spm.SentencePieceProcessor(model_file=str(path)).encode("the cat <mask> sat")  # The model's
  # user-defined <mask> ...
  ids = v.encode("the cat <mask> sat")  # ... is never read from text.
  assert 4 not in ids and 0 not in ids and 1 not in ids


def test_models_lacking_a_special_are_rejected(tmp_path):
  # SentencePiece's defaults: unk=0, bos=1, eos=2, no pad, no <mask>.
  path = _plain_model(tmp_path / "plain")
  with pytest.raises(errors.UserError,
                     match=r"plain\.model lacks special tokens.*no '<mask>' piece"):
    vocab.load_vocabulary(path)
  path = _plain_model(tmp_path / "nopad", user_defined_symbols=["<mask>"])
  with pytest.raises(errors.UserError,
                     match=r"nopad\.model lacks special tokens.*defines no pad id"):
    vocab.load_vocabulary(path)
  with pytest.raises(errors.UserError, match="does not exist"):
    vocab.load_vocabulary(tmp_path / "missing.model")
  (tmp_path / "junk.model").write_bytes(b"not a model")
  with pytest.raises(errors.UserError, match="not a readable"):
    vocab.load_vocabulary(tmp_path / "junk.model")


def test_bad_training_requests(tmp_path):
  with pytest.raises(errors.UserError, match="empty corpus"):
    vocab.train_sentencepiece(["", "  "], vocab_size=61,
                              model_path=tmp_path / "x.model")
  with pytest.raises(errors.UserError, match="smaller vocab_size"):
    vocab.train_sentencepiece(["a b"], vocab_size=500,
                              model_path=tmp_path / "x.model")


def test_lazy_vocabulary_resolves_on_first_use(toy_corpus):
  _, model = toy_corpus
  calls = []

  def resolve():
    calls.append(1)
    return model

  lazy = vocab.LazyVocabulary(resolve)
  assert not calls
  assert lazy.vocab_size == 61 and len(calls) == 1
  assert lazy.sentencepiece_model_file == str(model) and len(calls) == 1
  assert vocab.LazyVocabulary(vocab.FixedPath("a")) == vocab.LazyVocabulary(
      vocab.FixedPath("a"))
  bad = vocab.LazyVocabulary(vocab.FixedPath("/nonexistent/x.model"))
  with pytest.raises(errors.UserError, match="does not exist"):
    _ = bad.vocab_size


def test_bible_vocabulary_cache_and_rebuild(bible_data_dir, tmp_path,
                                            monkeypatch):
  wheel = tmp_path / "bible_alignments"
  wheel.mkdir()
  name = vocab.bible.WHEEL_NAME
  (wheel / name).symlink_to(bible_data_dir / "bible_alignments" / name)
  built = []
  real_train = vocab.train_sentencepiece

  def counting_train(*args, **kwargs):
    built.append(kwargs["model_path"])
    return real_train(*args, **kwargs)

  monkeypatch.setattr(vocab, "train_sentencepiece", counting_train)
  # The real text is covered by tests/tasks; a toy text keeps this fast.
  monkeypatch.setattr(vocab, "bible_training_text", lambda root: (
      tiny_sentences("en", 200), {"en": 1, "grc": 2}))
  path = vocab.bible_vocabulary(50, tmp_path)
  assert path.name == "bible_grc_en_bpe50.model" and len(built) == 1
  manifest = json.loads(path.with_suffix(".json").read_text())
  assert manifest["inputs"]["split"]["test"] == [41, 50, 59]
  corpus = manifest["inputs"]["corpus"]
  assert corpus["wheel_sha256"] == vocab.bible.WHEEL_SHA256
  assert manifest["built"]["repeats"] == {"en": 1, "grc": 2}
  assert vocab.load_vocabulary(path).vocab_size == 50

  assert vocab.bible_vocabulary(50, tmp_path) == path and len(built) == 1
  vocab.bible_vocabulary(50, tmp_path, seed=7)  # Changed input: rebuild.
  assert len(built) == 2
  monkeypatch.setattr(vocab, "BIBLE_RECIPE_VERSION", 99)
  vocab.bible_vocabulary(50, tmp_path)
  assert len(built) == 3
  vocab.bible_vocabulary(50, tmp_path)
  assert len(built) == 3
  monkeypatch.setattr(vocab.bible, "TEST_BOOKS", frozenset({41}))
  vocab.bible_vocabulary(50, tmp_path)  # Changed split definition.
  assert len(built) == 4
