"""Fixtures of the transfer tests: a toy SentencePiece model and a tiny encoder for it."""

import random

import pytest

from flax_xalign.models.encoder import Encoder
from tests import testlib
from tests.evaluation.transfer_testlib import random_params


@pytest.fixture(scope="session")
def spm_vocabulary(tmp_path_factory):
  """An 83-piece BPE SentencePiece model of the toy corpus, with the project's special ids."""
  import sentencepiece as spm

  prefix = tmp_path_factory.mktemp("spm") / "toy"
  text = [s for pair in testlib.sentences(random.Random(0), 400) for s in pair]
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(text), model_prefix=str(prefix), vocab_size=83, model_type="bpe",
      pad_id=0, eos_id=1, unk_id=2, bos_id=3, user_defined_symbols=["<mask>"], minloglevel=2,
      num_threads=1)
  return spm.SentencePieceProcessor(model_file=f"{prefix}.model")


@pytest.fixture(scope="session")
def transfer_model(spm_vocabulary):
  """(Encoder, random params): tests/conftest.py's tiny_encoder sizes, vocabulary doubled
  for transliteration."""
  config = testlib.tiny_encoder_config(vocab_size=2 * spm_vocabulary.get_piece_size())
  return Encoder(config), random_params(config)
