"""seqio tasks over the embedded Bible corpus (flax_xalign.data.bible).

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
Splits are whole books (see `flax_xalign.data.bible`). All tasks share one
SentencePiece model, `bible_vocabulary(BIBLE_VOCAB_SIZE)`, trained on the
training split the first time a dataset is built (not at import).
"""

import dataclasses
from typing import Dict, List

from flax_xalign.data import bible as corpus
from flax_xalign.data import vocab as vocab_lib

from . import registry

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
