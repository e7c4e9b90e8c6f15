"""Word-level featurisation for fine-tuning: `<s> pieces </s>` rows, labels on first subwords.

Examples are word-tokenised (`transfer_data.TaggedSentence` /
`LabelledSentence`). Each word is tokenised on its own and the row is
`<s> pieces </s>`; a tag sits on the first subword of its word (the other
subwords carry weight 0), a sentence label is predicted from the `<s>` state.
Rows longer than `max_length` keep a prefix of whole words; dropped words are
counted, never scored.

Sentence pairs (`transfer_data.SentencePair`, XNLI / PAWS-X) are laid out
as the run laid out translation pairs in pretraining (`pair_layout`,
`data.specials.PAIR_LAYOUTS`, via `word_align.layout_pair`): "restart" is
`<s> a </s> <s> b </s>` with positions restarting on side b, "continuous"
`<s> a </s> b </s>` with positions running on (XLM-R's fine-tuning input
without its doubled `</s>`). Both sides share the row budget as the feature
converter's `pair_budget` does; the label is predicted from the first `<s>`,
whose attention spans both sides.

The special ids (`<s>`, `</s>`, `<unk>`, padding, and which ids are regular
pieces) come from the vocabulary's `SpecialTokens` (`data.specials`), read
from its SentencePiece model unless given.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from flax_xalign.data.vocab.specials import SpecialTokens, check_pair_layout, special_tokens_of
from flax_xalign.errors import UserError
from flax_xalign.evaluation.transfer.transfer_data import LabelledSentence, SentencePair, TaggedSentence

LENGTH_MULTIPLE = 16  # Rows are padded to a multiple of this (see Featurizer.featurize).
# Special tokens a pair adds per layout (as `feature_converter.PAIR_SPECIALS`).
PAIR_SPECIALS = {"restart": 4, "continuous": 3}
Transliterate = Callable[[np.ndarray], np.ndarray]
Example = TaggedSentence | LabelledSentence | SentencePair


class EncodedWords(NamedTuple):
  """One word-tokenised sentence as `<s> pieces </s>`.

  Attributes:
    tokens: [n] int32 ids, n <= max_length.
    word_index: [n] int32: the word's index at its first subword, -1 elsewhere
      (specials and continuation subwords).
    num_words: how many leading words were kept (of both sides, for a pair).
    positions: [n] int32 position ids; None means 0..n-1.
  """

  tokens: np.ndarray
  word_index: np.ndarray
  num_words: int
  positions: np.ndarray | None = None


def encode_words(pieces: Sequence[Sequence[int]], *, max_length: int, specials: SpecialTokens,
                 transliterate: Transliterate | None = None) -> EncodedWords:
  """Lays out per-word subword ids as `<s> pieces </s>`, whole words only.

  Args:
    pieces: subword ids of each word; a word with none becomes `<unk>`.
    max_length: the row budget including `<s>` and `</s>`.
    specials: the vocabulary's special ids (`bos`, `eos`, `unk`, regular range).
    transliterate: optional map of natural to derived ids, applied to the
      subword ids; ids that are not regular (`specials.is_regular`) are kept
      as they are.
  """
  if max_length < 3:
    raise UserError(f"max_length={max_length} leaves no room for a word next to <s> and </s>.")
  pieces = [list(p) or [specials.unk] for p in pieces]
  budget, kept, used = max_length - 2, 0, 0
  while kept < len(pieces) and used + len(pieces[kept]) <= budget:
    used += len(pieces[kept])
    kept += 1
  body = np.asarray([t for p in pieces[:kept] for t in p], np.int32)
  if transliterate is not None and body.size:
    mapped = np.asarray(transliterate(body))
    if mapped.shape != body.shape:
      raise ValueError(f"transliterate changed the shape {body.shape} to {mapped.shape}.")
    body = np.where(specials.is_regular(body), mapped, body).astype(np.int32)
  starts = np.full(used, -1, np.int32)
  offsets = np.cumsum([0] + [len(p) for p in pieces[:kept]])[:-1]
  starts[offsets] = np.arange(kept, dtype=np.int32)
  tokens = np.concatenate([[specials.bos], body, [specials.eos]]).astype(np.int32)
  word_index = np.concatenate([[-1], starts, [-1]]).astype(np.int32)
  return EncodedWords(tokens, word_index, kept)


def _transliterated(pieces: list[list[int]], specials: SpecialTokens,
                    transliterate: Transliterate | None) -> list[list[int]]:
  if transliterate is None:
    return pieces
  flat = np.asarray([t for p in pieces for t in p], np.int32)
  if not flat.size:
    return pieces
  mapped = np.asarray(transliterate(flat))
  if mapped.shape != flat.shape:
    raise ValueError(f"transliterate changed the shape {flat.shape} to {mapped.shape}.")
  mapped = np.where(specials.is_regular(flat), mapped, flat).astype(np.int32)
  ends = np.cumsum([len(p) for p in pieces])
  return [m.tolist() for m in np.split(mapped, ends[:-1])]


def encode_pair_words(first: Sequence[Sequence[int]], second: Sequence[Sequence[int]], *,
                      max_length: int, specials: SpecialTokens, pair_layout: str = "restart",
                      transliterate: Transliterate | None = None) -> EncodedWords:
  """Lays out a sentence pair's per-word subword ids in the run's pair layout.

  Args:
    first, second: subword ids of each word of the two sentences; a word with
      none becomes `<unk>`.
    max_length: the row budget including the layout's specials; the sides
      share what is left as the feature converter's `pair_budget` does
      (whole words only).
    specials: the vocabulary's special ids.
    pair_layout: "restart" (`<s> a </s> <s> b </s>`, positions restart) or
      "continuous" (`<s> a </s> b </s>`, positions run on).
    transliterate: optional natural -> derived id map of regular ids.

  Returns:
    EncodedWords with `positions`; `word_index` is -1 everywhere (pairs carry
    one label per row) and `num_words` counts the kept words of both sides.
  """
  from flax_xalign.evaluation.word_alignment.word_align import (
    layout_pair,  # The aligner's layout, not a copy.
  )

  layout = check_pair_layout(pair_layout)
  if max_length < PAIR_SPECIALS[layout] + 2:
    raise UserError(f"max_length={max_length} leaves no room for a word on each side of a {layout} pair "
                    f"({PAIR_SPECIALS[layout]} special tokens); raise max_length.")
  sides = [_transliterated([list(p) or [specials.unk] for p in side], specials, transliterate)
           for side in (first, second)]
  row = layout_pair(sides[0], sides[1], src_lang_id=1, tgt_lang_id=1, max_length=max_length,
                    max_side=max_length, specials=specials, pair_layout=layout)
  kept = sum(int(words[-1]) + 1 for words in (row.src_words, row.tgt_words) if words.size)
  return EncodedWords(row.tokens, np.full(row.tokens.shape, -1, np.int32), kept, row.positions)


class FeatureSet(NamedTuple):
  """Padded model inputs and labels of a list of examples.

  Attributes:
    tokens: [examples, length] int32; the featurizer's `specials.pad` is
      padding.
    labels: [examples, length] (tagging, on first subwords) or [examples]
      (classification, pair classification) int32 indices into the label set.
    weights: float32, the shape of `labels`; 1 where a label is scored.
    words_dropped: words cut by truncation (tagging: never scored).
    positions: [examples, length] int32 position ids (0 on padding); None
      means 0, 1, ... along every row.
  """

  tokens: np.ndarray
  labels: np.ndarray
  weights: np.ndarray
  words_dropped: int
  positions: np.ndarray | None = None


def _specials_of(vocabulary: Any) -> SpecialTokens:
  try:
    return special_tokens_of(vocabulary)
  except AttributeError as e:  # No SentencePiece model to read the ids from.
    raise UserError(f"cannot read special token ids from {type(vocabulary).__name__} (it has "
                    "no SentencePiece model); build the Featurizer with "
                    "specials=SpecialTokens(...).") from e


class Featurizer:
  """Featurises word-tokenised examples with a vocabulary; caches each word's pieces.

  Args:
    vocabulary: a seqio / SentencePiece vocabulary (anything with
      `encode(str) -> list[int]`).
    max_length: the longest row, `<s>` and `</s>` included.
    specials: the vocabulary's special ids; None reads them from its
      SentencePiece model (`data.specials.special_tokens_of`).
    pair_layout: how sentence pairs are laid out, as the model's pretraining
      laid out translation pairs (`RunSpec.pair_layout`).
  """

  def __init__(self, vocabulary: Any, *, max_length: int = 128,
               specials: SpecialTokens | None = None, pair_layout: str = "restart"):
    if max_length < 3:
      raise UserError(f"max_length={max_length} must be at least 3.")
    self.vocabulary = vocabulary
    self.max_length = int(max_length)
    self.specials = specials if specials is not None else _specials_of(vocabulary)
    self.pair_layout = check_pair_layout(pair_layout)
    self._pieces: dict[str, list[int]] = {}

  def word_pieces(self, words: Sequence[str]) -> list[list[int]]:
    """Subword ids of each word, tokenised alone (cached)."""
    missing = [w for w in dict.fromkeys(words) if w not in self._pieces]
    if missing:
      processor = getattr(self.vocabulary, "tokenizer", None)
      encoded = (processor.encode(missing) if processor is not None
                 else [self.vocabulary.encode(w) for w in missing])
      self._pieces.update((w, [int(t) for t in ids]) for w, ids in zip(missing, encoded))
    return [self._pieces[w] for w in words]

  def encode(self, words: Sequence[str], *, transliterate: Transliterate | None = None
             ) -> EncodedWords:
    return encode_words(self.word_pieces(words), max_length=self.max_length,
                        specials=self.specials, transliterate=transliterate)

  def encode_pair(self, first: Sequence[str], second: Sequence[str], *,
                  transliterate: Transliterate | None = None) -> EncodedWords:
    return encode_pair_words(self.word_pieces(first), self.word_pieces(second),
                             max_length=self.max_length, specials=self.specials,
                             pair_layout=self.pair_layout, transliterate=transliterate)

  def _encode_example(self, example: Example, transliterate: Transliterate | None) -> EncodedWords:
    if isinstance(example, SentencePair):
      return self.encode_pair(example.first, example.second, transliterate=transliterate)
    return self.encode(example.words, transliterate=transliterate)

  def featurize(self, examples: Sequence[Example], *,
                label_index: Mapping[str, int], transliterate: Transliterate | None = None
                ) -> FeatureSet:
    """Featurises and pads all examples to one length (see `FeatureSet`).

    The length is the longest row rounded up to a multiple of
    `LENGTH_MULTIPLE`, at most `max_length`: one shape per data set (so one
    compilation), without paying for `max_length` when every row is shorter.
    Derived copies of a data set (reordered words, transliterated ids) have
    the same row lengths, hence the same shape.
    """
    tagging = task_of(examples) == "tagging"
    encoded = [self._encode_example(e, transliterate) for e in examples]
    n = len(examples)
    longest = max(e.tokens.size for e in encoded)
    length = min(self.max_length, -(-longest // LENGTH_MULTIPLE) * LENGTH_MULTIPLE)
    tokens = np.full((n, length), self.specials.pad, np.int32)
    positions = np.zeros((n, length), np.int32)
    labels = np.zeros((n, length) if tagging else (n,), np.int32)
    weights = np.zeros(labels.shape, np.float32)
    dropped = 0
    for i, (example, row) in enumerate(zip(examples, encoded)):
      tokens[i, :row.tokens.size] = row.tokens
      positions[i, :row.tokens.size] = (np.arange(row.tokens.size) if row.positions is None
                                        else row.positions)
      dropped += _word_count(example) - row.num_words
      if tagging:
        slots = np.flatnonzero(row.word_index >= 0)
        labels[i, slots] = [_index(label_index, example.tags[w]) for w in row.word_index[slots]]
        weights[i, slots] = 1.0
      else:
        labels[i], weights[i] = _index(label_index, example.label), 1.0
    return FeatureSet(tokens, labels, weights, dropped, positions)


def _word_count(example: Example) -> int:
  if isinstance(example, SentencePair):
    return len(example.first) + len(example.second)
  return len(example.words)


def _index(label_index: Mapping[str, int], label: str) -> int:
  if label not in label_index:
    raise UserError(f"label {label!r} is not in the label set {sorted(label_index)}.")
  return label_index[label]


def task_of(examples: Sequence[Example]) -> str:
  """"tagging" for TaggedSentences, "classification" for LabelledSentences,
  "pair_classification" for SentencePairs."""
  if not examples:
    raise UserError("no examples.")
  for kind, task in ((TaggedSentence, "tagging"), (LabelledSentence, "classification"),
                     (SentencePair, "pair_classification")):
    if all(isinstance(e, kind) for e in examples):
      return task
  raise UserError("examples must be all TaggedSentences or all LabelledSentences, or all SentencePairs.")


def head_task(task: str) -> str:
  """The `models.heads` task of a fine-tuning task: a pair is classified from its first `<s>`."""
  return "classification" if task == "pair_classification" else task


def label_set_of(*example_lists: Sequence[Example]) -> tuple[str, ...]:
  """Sorted labels (tags or sentence labels) occurring in the example lists."""
  labels = set()
  for examples in example_lists:
    for e in examples:
      labels.update(e.tags if isinstance(e, TaggedSentence) else (e.label,))
  return tuple(sorted(labels))


def label_index_of(label_set: Sequence[str]) -> dict[str, int]:
  """{label: its logit index} for a label set."""
  return {label: i for i, label in enumerate(label_set)}
