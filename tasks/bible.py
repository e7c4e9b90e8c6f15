"""seqio tasks over the embedded Bible corpus (flax_xalign.data.sources.bible).

=====================  ======================================  ===============
name                   examples (one verse each)               languages
=====================  ======================================  ===============
bible_en_mlm           BSB verses (OT + NT)                    en
bible_grc_mlm          SBLGNT verses                           grc
bible_grc_en_tlm       Greek verse + the English translating   en, grc
                       it (tokens = Greek, tokens_b = English)
bible_grc_en_mlm_tlm   mixture of the three, rate n ** 0.7     en, grc
=====================  ======================================  ===============

Train sizes are 29,608 / 6,346 / 6,343 verses, so the mixture (rate n ** 0.7,
n = training examples of the task, as in XLM) draws 59.5 % / 20.2 % / 20.2 %
of its examples from them.
Splits are whole books (see `flax_xalign.data.sources.bible`). All tasks share one
SentencePiece model, `bible_vocabulary(BIBLE_VOCAB_SIZE)`, trained on the
training split the first time a dataset is built (not at import).

`BibleTasks(prefix, vocabulary_path, normalize)` registers the same four under
another vocabulary, e.g. an imported model's, so its pretraining can continue
on the Bible (`{prefix}_en_mlm`, `{prefix}_grc_mlm`, `{prefix}_grc_en_tlm`,
`{prefix}_grc_en_mlm_tlm`):

    BibleTasks(prefix="e5_bible", vocabulary_path="runs/e5_bible/vocabulary.model",
               normalize="nfd_strip_marks").register()
"""

import dataclasses
from typing import Dict, List

from flax_xalign.data.sources import bible as corpus
from flax_xalign.data.vocab import sentencepiece as vocab_lib
from . import registry
from . import user

BIBLE_VOCAB_SIZE = 8000
MIXTURE_ALPHA = 0.7


@dataclasses.dataclass(frozen=True)
class BibleVocabularyPath:
  """Resolves (training on first use) the Bible SentencePiece model."""
  vocab_size: int = BIBLE_VOCAB_SIZE

  def __call__(self) -> str:
    return str(vocab_lib.bible_vocabulary(self.vocab_size))


VOCABULARY = vocab_lib.LazyVocabulary(BibleVocabularyPath())


def english_text(split: str) -> Dict[str, List[str]]:
  return {"text": [text for _, text in corpus.english_verses(split)]}


def greek_text(split: str) -> Dict[str, List[str]]:
  return {"text": [text for _, text in corpus.greek_verses(split)]}


def greek_english_bitext(split: str) -> Dict[str, List[str]]:
  pairs = corpus.bitext(split)
  return {"text": [grc for _, grc, _ in pairs],
          "text_b": [en for _, _, en in pairs]}


registry.register_task("bible_en_mlm", loader=english_text,
                       vocabulary=VOCABULARY, lang="en",
                       splits=corpus.SPLITS)
registry.register_task("bible_grc_mlm", loader=greek_text,
                       vocabulary=VOCABULARY, lang="grc",
                       splits=corpus.SPLITS)
registry.register_task("bible_grc_en_tlm", loader=greek_english_bitext,
                       vocabulary=VOCABULARY, lang="grc", lang_b="en",
                       splits=corpus.SPLITS)
registry.register_mixture(
    "bible_grc_en_mlm_tlm",
    ["bible_en_mlm", "bible_grc_mlm", "bible_grc_en_tlm"], alpha=MIXTURE_ALPHA)


@dataclasses.dataclass(frozen=True)
class BibleTasks:
  """The embedded Bible tasks under another SentencePiece vocabulary.

  Attributes:
    prefix: name prefix of the four tasks (the mixture is
      `{prefix}_grc_en_mlm_tlm`).
    vocabulary_path: a SentencePiece model with the five special tokens, e.g.
      an imported model's `vocabulary.model` (its ids are the model's ids).
    normalize: text normaliser for both languages (`data.normalize`), e.g.
      "nfd_strip_marks" to drop polytonic Greek diacritics; align with the
      same `--normalize`.
  """
  prefix: str
  vocabulary_path: str
  normalize: str = ""

  def names(self) -> Dict[str, str]:
    return {kind: f"{self.prefix}_{kind}" for kind in ("en_mlm", "grc_mlm", "grc_en_tlm", "grc_en_mlm_tlm")}

  def register(self) -> "BibleTasks":
    """Registers the three tasks and their mixture (idempotent); returns self."""
    names = self.names()
    spec = dataclasses.replace(
        self, vocabulary_path=user._vocabulary_path(names["en_mlm"], self.vocabulary_path),
        normalize=user._normalizer(names["en_mlm"], self.normalize))
    vocabulary = user._vocabulary(spec.vocabulary_path)
    common = dict(vocabulary=vocabulary, splits=corpus.SPLITS, spec=spec, normalize=spec.normalize)
    registry.register_task(names["en_mlm"], loader=english_text, lang="en",
                           definition=(spec, "en_mlm"), **common)
    registry.register_task(names["grc_mlm"], loader=greek_text, lang="grc",
                           definition=(spec, "grc_mlm"), **common)
    registry.register_task(names["grc_en_tlm"], loader=greek_english_bitext, lang="grc", lang_b="en",
                           definition=(spec, "grc_en_tlm"), **common)
    registry.register_mixture(names["grc_en_mlm_tlm"],
                              [names["en_mlm"], names["grc_mlm"], names["grc_en_tlm"]],
                              alpha=MIXTURE_ALPHA, definition=(spec, "mixture"), spec=spec)
    return self
