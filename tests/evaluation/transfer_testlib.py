"""Helpers shared by the transfer tests: a toy tagging task, fake vocabulary and language.

Models are tiny and randomly initialised (`random_params`); the fixtures in
conftest.py build one SentencePiece model and one encoder config (vocabulary
doubled, as a transliterating language needs) for every transfer test, so the
tagging train step compiles once per session.
"""

import dataclasses
import random

import flax.linen as nn
import jax
import numpy as np

from flax_xalign.evaluation.transfer.transfer_data import TaggedSentence
from flax_xalign.models.encoder import Encoder

# A part-of-speech-like tag per word of the toy corpus: a function of the word.
POS = {**dict.fromkeys("the a das ein".split(), "det"),
       **dict.fromkeys("house dog cat tree river haus hund katze baum fluss".split(), "noun"),
       **dict.fromkeys("sees runs sieht läuft".split(), "verb"),
       **dict.fromkeys("big small red green old new groß klein rot grün alt neu".split(), "adj")}
STEPS, BATCH, LENGTH, LR = 60, 16, 24, 1e-2


class WordVocabulary:
  """A fake vocabulary: fixed pieces per word (no SentencePiece model, so no special ids)."""

  def __init__(self, pieces):
    self.pieces = pieces

  def encode(self, word):
    return self.pieces[word]


def vocabulary_pieces(vocabulary, words):
  return [vocabulary.encode(w) for w in words]


@dataclasses.dataclass(frozen=True)
class FakeLanguage:
  """The SyntheticLanguage interface: optional inversion and +V transliteration."""

  vocab_size: int
  invert: bool = False
  transliterates: bool = False
  seeds: list = dataclasses.field(default_factory=list, compare=False)

  @property
  def name(self):
    return "fake" + ("_inv" if self.invert else "") + ("_trans" if self.transliterates else "")

  @property
  def derived_vocab_size(self):
    return 2 * self.vocab_size if self.transliterates else self.vocab_size

  def transform_words(self, words, labels=None, *, parse=None, sentence_seed=0):
    del parse
    self.seeds.append(sentence_seed)
    order = list(range(len(words)))[::-1] if self.invert else list(range(len(words)))
    return ([words[i] for i in order],
            {k: [v[i] for i in order] for k, v in (labels or {}).items()})

  def transliterate_ids(self, ids):
    return np.where(ids >= 5, ids + self.vocab_size, ids)


def tagged(n, seed):
  """n toy sentences of 2-7 words with their POS tags."""
  rng = random.Random(seed)
  words = sorted(POS)
  out = []
  for _ in range(n):
    sentence = tuple(rng.choice(words) for _ in range(rng.randint(2, 7)))
    out.append(TaggedSentence(sentence, tuple(POS[w] for w in sentence)))
  return out


def random_params(config, seed=0):
  """Encoder parameters drawn in numpy (compiling the encoder's init costs seconds on CPU)."""
  shapes = jax.eval_shape(lambda: nn.meta.unbox(
      Encoder(config).init_variables(jax.random.key(0))["params"]))
  rng = np.random.default_rng(seed)

  def draw(path, leaf):
    name = path[-1].key
    if name == "scale":
      return np.ones(leaf.shape, leaf.dtype)
    if name in ("bias", "output_bias"):
      return np.zeros(leaf.shape, leaf.dtype)
    return rng.normal(0.0, config.initializer_std, leaf.shape).astype(leaf.dtype)

  return jax.tree_util.tree_map_with_path(draw, shapes)
