"""Special token ids: the one definition every module reads them from.

A vocabulary decides which ids are padding, `<s>`, `</s>`, `<unk>` and
`<mask>`, and which ids are regular text pieces (the only ones that may be
masked, drawn as random replacements, aligned or translated). Our own
SentencePiece models use `PROJECT` (0..4 special, regular from 5); an imported
XLM-R vocabulary is another instance (`<s>`=0, `<pad>`=1, `</s>`=2, `<unk>`=3,
`<mask>`=250001, regular ids 4..250000), and a BERT WordPiece vocabulary a
third ([PAD]=0, [UNK]=100, [CLS]=101 as `<s>`, [SEP]=102 as `</s>`,
[MASK]=103, regular after the reserved [unusedN] block).

The run's vocabulary asset (`flax_xalign.assets.vocabulary`) records the ids
in the run manifest; the model, objectives, feature converter, aligner and
fine-tuning harness all take them from there. This module imports nothing
heavy (no TensorFlow), so jitted code may depend on it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

# How a translation pair is laid out in one row (training, DWA, the aligner):
# "restart": `<s> a </s> <s> b </s>`, positions restart at 0 on side b (the
#   paper's XLM/TLM layout, and the default);
# "continuous": `<s> a </s> b </s>`, positions run on across the pair (the
#   released XLM-Align code, XLM-R style).
PAIR_LAYOUTS = ("restart", "continuous")


def check_pair_layout(pair_layout: str, *, where: str = "pair_layout") -> str:
  """`pair_layout` if it is one of PAIR_LAYOUTS, else one UserError naming `where`."""
  if pair_layout not in PAIR_LAYOUTS:
    from flax_xalign.errors import UserError

    raise UserError(f"{where}={pair_layout!r} is not a pair layout; use one of {', '.join(map(repr, PAIR_LAYOUTS))} "
                    "(restart: <s> a </s> <s> b </s>, positions restart; continuous: <s> a </s> b </s>).")
  return pair_layout


@dataclasses.dataclass(frozen=True, kw_only=True)
class SpecialTokens:
  """Special ids of one vocabulary and the range of its regular ids.

  Attributes:
    pad: padding id (the feature converter pads batches with it).
    eos: `</s>`, closes a sentence or a side of a pair.
    unk: `<unk>`.
    bos: `<s>`, opens a sentence or a side of a pair.
    mask: `<mask>`, shown in place of masked tokens.
    first_regular: the smallest regular (text piece) id.
    end_regular: one past the largest regular id; None means the vocabulary
      size (the model's embedding rows).
  """

  pad: int = 0
  eos: int = 1
  unk: int = 2
  bos: int = 3
  mask: int = 4
  first_regular: int = 5
  end_regular: int | None = None

  def __post_init__(self):
    ids = {"pad": self.pad, "eos": self.eos, "unk": self.unk, "bos": self.bos, "mask": self.mask}
    for name, value in ids.items():
      if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"SpecialTokens.{name} must be an int >= 0, got {value!r}.")
    if len(set(ids.values())) != len(ids):
      raise ValueError(f"SpecialTokens ids must be distinct, got {ids}.")
    if self.end_regular is not None and self.end_regular <= self.first_regular:
      raise ValueError(f"SpecialTokens.end_regular={self.end_regular} must exceed "
                       f"first_regular={self.first_regular}.")

  def regular_range(self, vocab_size: int) -> tuple[int, int]:
    """[low, high) of the regular ids in a vocabulary of `vocab_size` rows."""
    high = vocab_size if self.end_regular is None else min(self.end_regular, vocab_size)
    return self.first_regular, high

  def is_regular(self, ids: Any) -> Any:
    """Boolean mask of regular ids (numpy or jax arrays; same type back)."""
    regular = ids >= self.first_regular
    if self.end_regular is not None:
      regular = regular & (ids < self.end_regular)
    return regular

  def as_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> "SpecialTokens":
    return cls(**dict(values))


# The layout of every SentencePiece model trained by flax_xalign.data.vocab.sentencepiece.
PROJECT = SpecialTokens()


def special_tokens_of(vocabulary: Any) -> SpecialTokens:
  """The special ids of a seqio vocabulary, read from its model.

  A vocabulary that knows its own layout says so through `special_tokens()`
  (`flax_xalign.data.vocab.wordpiece.WordPieceVocabulary`: BERT's [PAD], [UNK],
  [CLS], [SEP], [MASK]; checked here by that method, not by type, so this
  module stays free of TensorFlow). Otherwise it must expose a SentencePiece
  processor as `.tokenizer` (seqio's `SentencePieceVocabulary`, our
  `LazyVocabulary` and `DoubledVocabulary`) or be a processor itself; its
  regular ids are those above every special id.

  Raises:
    ValueError: the model has no `<mask>` piece or lacks one of the ids.
  """
  own = getattr(vocabulary, "special_tokens", None)
  if callable(own):
    return own()
  processor = getattr(vocabulary, "tokenizer", vocabulary)
  ids = {"pad": processor.pad_id(), "eos": processor.eos_id(), "unk": processor.unk_id(),
         "bos": processor.bos_id()}
  mask = processor.piece_to_id("<mask>")
  if mask == ids["unk"] or mask < 0:
    raise ValueError("the SentencePiece model has no '<mask>' piece; retrain it with "
                     "`xalign vocab` (which adds one).")
  missing = [name for name, value in ids.items() if value < 0]
  if missing:
    raise ValueError(f"the SentencePiece model defines no {', '.join(missing)} id; retrain it with "
                     "`xalign vocab`.")
  special = {*ids.values(), mask}
  first = 0
  while first in special:  # Regular ids run from after the leading specials ...
    first += 1
  end = min((i for i in special if i > first), default=None)  # ... up to the next special (XLM-R's <mask>).
  return SpecialTokens(**ids, mask=mask, first_regular=first, end_regular=end)
