"""seqio tasks for synthetic languages derived from the Greek New Testament.

The controlled setting of Deshpande et al. 2021 / Tang et al. (ALIGN-MLM): a
natural language (Koine Greek, SBLGNT) and a derived copy made by word-level
transforms (inversion; syntax given CoNLL-U parses) and transliteration
(token id i -> i + V). `register_synthetic(language)` registers, for
`name = language.name` (e.g. "trans_inv"):

=============================  =================================  =========================
name                           examples (one verse each)          languages
=============================  =================================  =========================
synthetic_<name>_natural       Greek verses                       grc
synthetic_<name>_derived       the same verses, transformed       grc~<name>
synthetic_<name>_tlm           a fixed `tlm_fraction` of the      grc, grc~<name>
                               train verses as natural/derived
                               pairs (tokens = natural)
synthetic_<name>_mlm           mixture of natural + derived       (MLM, DICT-MLM, ALIGN-MLM)
synthetic_<name>_xlm           natural + derived + tlm            (XLM = MLM + TLM)
=============================  =================================  =========================

Mixture rates are proportional to the number of examples (alpha 1), so XLM's
TLM data is `tlm_fraction` (25% by default, as in the paper) of each MLM
stream. All tasks share one vocabulary of 2V ids: the natural Greek
SentencePiece model (trained on the training books only) plus its transliterated
copy. Splits are the corpus' book-level splits.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
from typing import Any, Dict, List, Optional

import numpy as np
import seqio

from flax_xalign.data.sources import bible as corpus
from flax_xalign.data.sources import paths
from flax_xalign.data.vocab import sentencepiece as vocab_lib
from flax_xalign.data.transforms.synthetic import SyntheticLanguage

from . import registry

NATURAL = "grc"
DEFAULT_VOCAB_SIZE = 2000
_MODEL_TYPE = "bpe"
_LANGUAGES: Dict[str, SyntheticLanguage] = {}
_SPECS: Dict[str, "SyntheticTasks"] = {}


@dataclasses.dataclass(frozen=True)
class GreekVocabularyPath:
  """Resolves (training on first use) the Greek-only SentencePiece model."""
  vocab_size: int = DEFAULT_VOCAB_SIZE

  def __call__(self) -> str:
    root = pathlib.Path(paths.data_dir())
    path = root / "vocab" / f"sblgnt_grc_{_MODEL_TYPE}{self.vocab_size}.model"
    if not path.exists():
      corpus.ensure_wheel(root)
      print(f"flax_xalign: training the {self.vocab_size}-piece Greek SentencePiece model into {path} (once)",
            flush=True)
      vocab_lib.train_sentencepiece([t for _, t in corpus.greek_verses("train")], vocab_size=self.vocab_size,
                                    model_path=path, model_type=_MODEL_TYPE)
    return str(path)


class DoubledVocabulary(seqio.Vocabulary):
  """A SentencePiece vocabulary of V pieces reported as `factor * V` ids.

  Encoding is the base model's (natural ids); tasks re-map derived sides with
  their id map. Decoding maps ids >= V back to their natural piece.
  """

  def __init__(self, base: seqio.SentencePieceVocabulary, factor: int = 2):
    self._base = base
    self._factor = factor
    super().__init__(extra_ids=0)

  @property
  def base(self) -> seqio.SentencePieceVocabulary:
    return self._base

  @property
  def sp_model(self) -> bytes:
    """The base model's bytes (checkpoint fingerprints hash them with the size)."""
    return self._base.sp_model

  @property
  def tokenizer(self) -> Any:
    return self._base.tokenizer

  @property
  def natural_size(self) -> int:
    return self._base.vocab_size

  @property
  def eos_id(self) -> Optional[int]:
    return self._base.eos_id

  @property
  def unk_id(self) -> Optional[int]:
    return self._base.unk_id

  @property
  def _base_vocab_size(self) -> int:
    return self._factor * self._base.vocab_size

  def _encode(self, s: str) -> List[int]:
    return list(self._base.encode(s))

  def _decode(self, ids) -> str:
    v = self._base.vocab_size
    return self._base.decode([int(i) % v if int(i) >= v else int(i) for i in ids])

  def _encode_tf(self, s):
    return self._base.encode_tf(s)

  def _decode_tf(self, ids):
    import tensorflow as tf

    v = self._base.vocab_size
    return self._base.decode_tf(tf.where(ids >= v, ids % v, ids))

  def __eq__(self, other: Any) -> bool:
    return (isinstance(other, DoubledVocabulary) and other._factor == self._factor
            and other._base == self._base)

  def __hash__(self) -> int:
    return hash((DoubledVocabulary, self._factor, hash(self._base)))

  def __str__(self) -> str:
    return f"DoubledVocabulary({self._base}, x{self._factor})"


def derived_language_code(language: SyntheticLanguage) -> str:
  return f"{NATURAL}~{language.name}"


@functools.lru_cache(maxsize=None)
def _greek_words(split: str) -> tuple:
  return tuple((verse, tuple(w for w, _ in words)) for verse, words in corpus.greek_tokens(split))


@dataclasses.dataclass(frozen=True)
class _Loader:
  """Verse text of one side (natural / derived / pairs); picklable, comparable."""
  language: SyntheticLanguage
  side: str  # "natural", "derived" or "pairs"
  tlm_fraction: float = 0.25

  def _kept(self, count: int) -> np.ndarray:
    """Which of `count` verses the pairs side keeps (a fixed, seeded subset)."""
    return np.random.default_rng(self.language.seed).random(count) < self.tlm_fraction

  def num_examples(self, split: str) -> int:
    """The split's size without transforming any verse (mixture rates)."""
    count = len(_greek_words(split))
    return int(self._kept(count).sum()) if self.side == "pairs" else count

  def __call__(self, split: str) -> Dict[str, List[str]]:
    verses = _greek_words(split)
    if self.side == "pairs":
      keep = self._kept(len(verses))
      verses = tuple(v for v, k in zip(verses, keep) if k)
    natural = [" ".join(words) for _, words in verses]
    if self.side == "natural":
      return {"text": natural}
    derived = [" ".join(self.language.transform_words(list(words), sentence_seed=int(verse))[0])
               for verse, words in verses]
    if self.side == "derived":
      return {"text": derived}
    return {"text": natural, "text_b": derived}


def names(language: SyntheticLanguage) -> Dict[str, str]:
  prefix = f"synthetic_{language.name}"
  return {"natural": f"{prefix}_natural", "derived": f"{prefix}_derived", "tlm": f"{prefix}_tlm",
          "mlm": f"{prefix}_mlm", "xlm": f"{prefix}_xlm"}


def register_synthetic(language: SyntheticLanguage, *, tlm_fraction: float = 0.25) -> Dict[str, str]:
  """Registers the tasks and mixtures above (idempotent); returns their names."""
  vocabulary = DoubledVocabulary(vocab_lib.LazyVocabulary(GreekVocabularyPath(language.vocab_size)))
  id_map = tuple(int(i) for i in language.id_map())
  derived = derived_language_code(language)
  n = names(language)
  # What registry.describe reports for every name, to re-register them elsewhere.
  spec = SyntheticTasks(transforms=language.name, vocab_size=language.vocab_size, overlap=language.overlap,
                        seed=language.seed, tlm_fraction=tlm_fraction)
  registry.register_task(n["natural"], loader=_Loader(language, "natural"), vocabulary=vocabulary,
                         lang=NATURAL, definition=("synthetic", language, "natural"), spec=spec)
  registry.register_task(n["derived"], loader=_Loader(language, "derived"), vocabulary=vocabulary,
                         lang=derived, definition=("synthetic", language, "derived"), id_maps=(id_map, None),
                         spec=spec)
  registry.register_task(n["tlm"], loader=_Loader(language, "pairs", tlm_fraction), vocabulary=vocabulary,
                         lang=NATURAL, lang_b=derived, id_maps=(None, id_map),
                         definition=("synthetic", language, "pairs", tlm_fraction), spec=spec)
  registry.register_mixture(n["mlm"], [n["natural"], n["derived"]], alpha=1.0, spec=spec)
  registry.register_mixture(n["xlm"], [n["natural"], n["derived"], n["tlm"]], alpha=1.0, spec=spec)
  for name in n.values():
    _LANGUAGES[name] = language
    _SPECS[name] = spec
  return n


def spec_of(name: str) -> Optional["SyntheticTasks"]:
  """The `SyntheticTasks` spec that registered `name` (to re-register it elsewhere)."""
  return _SPECS.get(name)


def language_of(name: str) -> Optional[SyntheticLanguage]:
  """The synthetic language behind a registered task or mixture, if any."""
  return _LANGUAGES.get(name)


@dataclasses.dataclass(frozen=True)
class SyntheticTasks:
  """gin-friendly spec: `train.user_tasks = [@SyntheticTasks()]`.

  Attributes:
    transforms: e.g. "trans", "trans_inv" (see flax_xalign.data.transforms.synthetic).
    vocab_size: natural Greek SentencePiece size V (the model sees 2V ids).
    overlap: fraction of natural ids left shared.
    seed: draws shared ids and the TLM subset.
    tlm_fraction: parallel verses for XLM, relative to the MLM data.
  """
  transforms: str = "trans"
  vocab_size: int = DEFAULT_VOCAB_SIZE
  overlap: float = 0.0
  seed: int = 0
  tlm_fraction: float = 0.25

  def language(self) -> SyntheticLanguage:
    return SyntheticLanguage(transforms=self.transforms, vocab_size=self.vocab_size, overlap=self.overlap,
                             seed=self.seed)

  def register(self) -> "SyntheticTasks":
    register_synthetic(self.language(), tlm_fraction=self.tlm_fraction)
    return self
