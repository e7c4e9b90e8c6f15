"""Synthetic derived languages: transliteration, inversion and syntax.

A *natural* language (here Koine Greek from SBLGNT) gets *derived*
counterparts, as in ALIGN-MLM (Tang et al., 2022, appendix F) and
MultilingualAnalysis (Deshpande et al., 2021), so that cross-lingual transfer
can be measured between languages that differ in exactly one controlled way.

=======  =====================================  ==============================
name     what it changes                        applied to
=======  =====================================  ==============================
`trans`  the script: every regular token id i   token ids, after tokenisation
         becomes i + V (a copy of the
         vocabulary); special ids stay
`inv`    word order, reversed                   words, before tokenisation
`syn`    word order, re-linearised from a       words, before tokenisation
         dependency parse (`syntax.py`)
=======  =====================================  ==============================

`SyntheticLanguage(("trans", "inv"), V)` is T_trans o T_inv of the paper
(name `"trans_inv"`). The word-level transforms run in the order of the tuple;
transliteration works on ids, so its place in the tuple does not matter (it
commutes with reordering). As the ALIGN-MLM paper (G.2) does, inversion and
syntax reorder whole words, not subwords; unlike its pretraining script (which
keeps a sentence's final punctuation last), `inv` reverses every word (SBLGNT
has no punctuation). Words are never changed by `transform_words`; labels
attached to words (POS, NER, ...) move with them, and NER tags are repaired
so that every span opens with `B-` (`repair_bio`).

Which ids are regular comes from the natural vocabulary's `specials`
(`flax_xalign.data.vocab.specials.SpecialTokens`, our `PROJECT` layout by default):
pad, eos, unk, bos and mask, and every id outside [first_regular,
end_regular), keep their id, wherever they are (an XLM-R-layout vocabulary has
`<s>`=0 ... `<unk>`=3 and `<mask>` last).

Partial vocabulary overlap (`overlap`, ALIGN-MLM's `--one_to_one_file`): a
seeded random set of `round(overlap * R)` of the R regular ids keeps its id,
so those tokens are shared by both languages.

Example, derived POS data from the Greek corpus:

  lang = SyntheticLanguage(("trans", "inv"), vocab.vocab_size)
  for verse_id, pairs in bible.greek_tokens("train"):
    words, labels = lang.transform_words(
        [w for w, _ in pairs], {"pos": [p for _, p in pairs]},
        sentence_seed=int(verse_id))
    ids = lang.transliterate_ids(encode(" ".join(words)))

Determinism: the shared ids depend only on `seed`; the syntax choices of a
sentence depend only on `(seed, sentence_seed)`, so any sentence can be
transformed alone, in any order or process, with the same result.
"""

from collections.abc import Mapping, Sequence
import dataclasses
import functools
import re
from typing import Optional

import numpy as np

from flax_xalign import errors
from flax_xalign.data.vocab.specials import PROJECT
from flax_xalign.data.vocab.specials import SpecialTokens
from flax_xalign.data.transforms import syntax as syntax_lib
TRANSFORMS = ("trans", "inv", "syn")
WORD_TRANSFORMS = ("inv", "syn")
_SHARED_IDS_STREAM = 0
_SYNTAX_STREAM = 1


def parse_transforms(spec: str) -> tuple[str, ...]:
  """Parses "trans", "trans_inv", "trans,inv", "trans+syn", "inv", ...

  Args:
    spec: transform names separated by `_`, `,`, `+` or spaces.

  Returns:
    The names, in the order given.

  Raises:
    UserError: an unknown or repeated name, or none at all.
  """
  names = tuple(n for n in re.split(r"[\s,_+]+", spec.strip().lower()) if n)
  if not names:
    raise errors.UserError(
        f"No transform in {spec!r}; name one or more of {TRANSFORMS}, e.g. "
        "'trans_inv'.")
  for name in names:
    if name not in TRANSFORMS:
      raise errors.UserError(
          f"Unknown transform {name!r} in {spec!r}; the known ones are "
          f"{', '.join(TRANSFORMS)} (combine them as e.g. 'trans_syn').")
  if len(set(names)) != len(names):
    raise errors.UserError(
        f"Transform spec {spec!r} repeats a transform; name each once.")
  return names


def _bio_spans(tags: Sequence[str]) -> list[Optional[int]]:
  """The span number of each tag in its original order (None for `O`)."""
  spans, previous_type, count = [], None, 0
  for tag in tags:
    if tag == "O":
      spans.append(None)
      previous_type = None
      continue
    if len(tag) < 3 or tag[:2] not in ("B-", "I-"):
      raise ValueError(
          f"NER tag {tag!r} is not BIO (O, B-TYPE or I-TYPE); convert "
          "BIOES tags to BIO, or leave this key out of bio_keys.")
    if tag[:2] == "B-" or tag[2:] != previous_type:
      count += 1
    spans.append(count)
    previous_type = tag[2:]
  return spans


def repair_bio(tags: Sequence[str], perm: Sequence[int]) -> list[str]:
  """Reorders BIO tags and re-marks span starts.

  Spans are read in the original order: a span opens at `B-X`, or at an `I-X`
  that does not follow a tag of type X (IOB1 style), and goes on through the
  `I-X` tags after it. After reordering, each maximal run of adjacent tokens
  from one span is an entity: its first token gets `B-X`, the others `I-X`.
  So a reversed `B-PER I-PER` reads `B-PER I-PER` again, two entities that
  become adjacent stay two, and a span split apart by the reordering becomes
  one entity per piece. The output is IOB2.

  Args:
    tags: the tags in the original order.
    perm: new position k holds old token `perm[k]`.

  Returns:
    The tags in the new order.

  Raises:
    ValueError: a tag is not O, B-TYPE or I-TYPE.
  """
  spans = _bio_spans(tags)
  result, previous = [], None
  for old in perm:
    span = spans[old]
    if span is None:
      result.append("O")
    else:
      prefix = "I-" if span == previous else "B-"
      result.append(prefix + tags[old][2:])
    previous = span
  return result


@dataclasses.dataclass(frozen=True)
class SyntheticLanguage:
  """A derived language: word-level transforms, then transliteration.

  Attributes:
    transforms: names from `TRANSFORMS`, e.g. ("trans",), ("trans", "inv"),
      ("trans", "syn"), ("inv",); a string is parsed with `parse_transforms`.
    vocab_size: V, the size of the natural vocabulary (ids 0..V-1).
    overlap: the fraction of the R regular ids (`regular_ids()`; 5..V-1 for
      our layout) that stay shared (keep their id); exactly
      `round(overlap * R)` of them (Python's round). Only with "trans".
    seed: draws the shared ids and, with `sentence_seed`, the syntax choices.
    syntax: the target order; required iff "syn" is in `transforms`.
    specials: the natural vocabulary's special ids; every id that is not
      regular (pad, eos, unk, bos, mask, anything outside [first_regular,
      end_regular)) maps to itself.
  """
  transforms: tuple[str, ...]
  vocab_size: int
  overlap: float = 0.0
  seed: int = 0
  syntax: Optional[syntax_lib.ReorderSpec] = None
  specials: SpecialTokens = PROJECT

  def __post_init__(self):
    transforms = self.transforms
    if isinstance(transforms, str):
      transforms = parse_transforms(transforms)
    else:
      transforms = parse_transforms(",".join(transforms))
    object.__setattr__(self, "transforms", transforms)
    if not isinstance(self.specials, SpecialTokens):
      raise errors.UserError(
          f"SyntheticLanguage: specials must be a flax_xalign.data.vocab.specials."
          f"SpecialTokens, got {self.specials!r}.")
    if not self._regular.any():
      raise errors.UserError(
          f"SyntheticLanguage: vocab_size={self.vocab_size} leaves no "
          f"regular ids (the special ids are {self.specials}).")
    if not 0.0 <= self.overlap <= 1.0:
      raise errors.UserError(
          f"SyntheticLanguage: overlap={self.overlap} is outside [0, 1].")
    if self.overlap and not self.transliterates:
      raise errors.UserError(
          f"SyntheticLanguage {self.name!r}: overlap={self.overlap} only "
          "applies to transliteration; add 'trans' or drop overlap.")
    if self.seed < 0:
      raise errors.UserError(
          f"SyntheticLanguage: seed={self.seed} must be >= 0.")
    if ("syn" in transforms) != (self.syntax is not None):
      raise errors.UserError(
          f"SyntheticLanguage {self.name!r}: pass syntax= (a "
          "syntax.ReorderSpec, e.g. ReorderSpec.from_string('SOV,AN')) "
          "exactly when 'syn' is among the transforms.")

  @property
  def name(self) -> str:
    """The transforms joined by `_`, e.g. "trans_inv"."""
    return "_".join(self.transforms)

  @property
  def transliterates(self) -> bool:
    return "trans" in self.transforms

  @property
  def derived_vocab_size(self) -> int:
    """2 V with transliteration (both scripts), else V."""
    return 2 * self.vocab_size if self.transliterates else self.vocab_size

  @functools.cached_property
  def _regular(self) -> np.ndarray:
    """bool [V]: True for the regular ids, the only ones transliterated."""
    ids = np.arange(self.vocab_size, dtype=np.int32)
    s = self.specials
    regular = np.asarray(s.is_regular(ids), dtype=bool)
    return regular & ~np.isin(ids, [s.pad, s.eos, s.unk, s.bos, s.mask])

  @functools.cached_property
  def _shared_ids(self) -> np.ndarray:
    regular = np.flatnonzero(self._regular).astype(np.int32)
    if not self.transliterates:
      return regular
    count = int(round(self.overlap * regular.size))
    rng = np.random.default_rng([self.seed, _SHARED_IDS_STREAM])
    return np.sort(rng.choice(regular, size=count, replace=False))

  @functools.cached_property
  def _id_map(self) -> np.ndarray:
    mapping = np.arange(self.vocab_size, dtype=np.int32)
    if self.transliterates:
      moved = self._regular.copy()
      moved[self._shared_ids] = False
      mapping[moved] += self.vocab_size
    return mapping

  def regular_ids(self) -> np.ndarray:
    """int32: the sorted regular ids of the natural vocabulary (`specials`)."""
    return np.flatnonzero(self._regular).astype(np.int32)

  def shared_ids(self) -> np.ndarray:
    """The sorted regular ids that keep their id (all of them without trans).
    """
    return self._shared_ids.copy()

  def id_map(self) -> np.ndarray:
    """int32 [V]: natural id -> derived id (i + V for a regular, non-shared id
    of a transliterating language; i otherwise, every special id included)."""
    return self._id_map.copy()

  def transliterate_ids(self, ids) -> np.ndarray:
    """Maps natural ids to derived ids.

    Args:
      ids: an integer array (or nested list) of any shape, values in [0, V).

    Returns:
      int32 array of the same shape.

    Raises:
      ValueError: a non-integer array or an id outside [0, V).
    """
    ids = np.asarray(ids)
    if ids.size == 0:
      return np.zeros(ids.shape, dtype=np.int32)
    if not np.issubdtype(ids.dtype, np.integer):
      raise ValueError(f"transliterate_ids: ids must be integers, got "
                       f"{ids.dtype}.")
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= self.vocab_size:
      raise ValueError(
          f"transliterate_ids: id {high if high >= self.vocab_size else low} "
          f"is outside the natural vocabulary [0, {self.vocab_size}); is it "
          "already transliterated, or from another vocabulary?")
    return self._id_map[ids]

  def permutation(self, n_words: int, *,
                  parse: Optional[syntax_lib.Sentence] = None,
                  sentence_seed: int = 0) -> list[int]:
    """The word order of `transform_words`.

    Args:
      n_words: the sentence length.
      parse: the sentence's dependency parse, one token per word (needed
        for "syn", ignored otherwise).
      sentence_seed: a non-negative int naming the sentence (e.g. its
        line number or verse id); with `seed` it draws the syntax choices.

    Returns:
      New position k holds old word `perm[k]`.

    Raises:
      UserError: "syn" without a parse, or a parse of another length.
    """
    if sentence_seed < 0:
      raise ValueError(f"sentence_seed={sentence_seed} must be >= 0.")
    perm = list(range(n_words))
    current = parse
    if "syn" in self.transforms:
      if parse is None:
        raise errors.UserError(
            f"SyntheticLanguage {self.name!r} needs the dependency parse of "
            "every sentence: pass parse= (read a CoNLL-U file with "
            "syntax.read_conllu).")
      if len(parse.tokens) != n_words:
        raise errors.UserError(
            f"The parse has {len(parse.tokens)} words but the sentence has "
            f"{n_words} (sentence_seed={sentence_seed}): parse the corpus "
            "with its own tokenisation (one word per CoNLL-U line).")
    rng = np.random.default_rng([self.seed, _SYNTAX_STREAM, sentence_seed])
    for transform in self.transforms:
      if transform == "inv":
        step = list(range(n_words - 1, -1, -1))
      elif transform == "syn":
        step = syntax_lib.reorder(current, self.syntax, rng=rng)
      else:
        continue
      perm = [perm[j] for j in step]
      if current is not None:
        current = syntax_lib.apply_permutation(current, step)
    return perm

  def transform_words(
      self, words: Sequence[str],
      labels: Optional[Mapping[str, Sequence]] = None, *,
      parse: Optional[syntax_lib.Sentence] = None, sentence_seed: int = 0,
      bio_keys: Sequence[str] = ("ner",)
  ) -> tuple[list[str], dict[str, list]]:
    """Applies the word-level transforms to one sentence and its labels.

    Args:
      words: the sentence's words.
      labels: per-word label sequences by name (e.g. {"pos": [...],
        "ner": [...]}), each as long as `words`; all move with their words.
      parse: see `permutation`.
      sentence_seed: see `permutation`.
      bio_keys: the label names holding BIO tags, repaired after reordering
        with `repair_bio`; other label sequences are only reordered.

    Returns:
      `(words, labels)` in the new order; the words themselves are never
      changed (transliteration happens on ids, `transliterate_ids`).

    Raises:
      ValueError: a label sequence of another length, or a non-BIO tag under
        a key of `bio_keys`.
      UserError: see `permutation`.
    """
    words = list(words)
    labels = {key: list(values) for key, values in (labels or {}).items()}
    for key, values in labels.items():
      if len(values) != len(words):
        raise ValueError(f"Label {key!r} has {len(values)} entries for "
                         f"{len(words)} words.")
    perm = self.permutation(len(words), parse=parse,
                            sentence_seed=sentence_seed)
    moved = {}
    for key, values in labels.items():
      if key in bio_keys:
        moved[key] = repair_bio(values, perm)
      else:
        moved[key] = [values[i] for i in perm]
    return [words[i] for i in perm], moved

