r"""Code-switching text by a bilingual dictionary: the file reader, a Python reference and the tf.data map.

A code-switched task (`flax_xalign.tasks.code_switch.CodeSwitchedTask`) swaps words of a monolingual
task's `text` for their dictionary translations before tokenisation, each translatable word with
probability `rate` (CoSDA-ML-style augmentation: the sentence keeps its language tag and its context,
some words arrive in the other language).

Dictionary files (UTF-8; blank lines and comment lines, '#' then a space, are skipped), one entry per
line:

* MUSE: `source target`, two whitespace-separated words (or `source<TAB>target`); a source word may
  have several lines, one per translation.
* `xalign bli` output: `source<TAB>target<TAB>score`, SentencePiece pieces. A leading
  '▁' marks a word start and is removed; a pair whose source or target piece lacks it is a
  word-internal piece (a suffix, not a word of the text) and is skipped, counted and reported. In
  a file with no '▁' but '##' continuations (a WordPiece vocabulary), '##' pieces are the
  word-internal ones. A first line `src<TAB>tgt<TAB>score` is read as a header.

Matching (the same rules in `switch_words`, the reference, and `switch_text_tf`, the map):

* Words are the runs of non-whitespace between ASCII whitespace (space, \t, \n, \v, \f, \r:
  `tf.strings.split`'s rule), so "a\u00a0b" is one word.
* A word's leading and trailing punctuation and symbols (Unicode categories P* and S*) are set aside,
  and the rest, the core, is looked up. A switched word keeps them: "«λόγος»," becomes "«word»,",
  so sentence punctuation, which the tokeniser sees either way, is not lost with the word. Dictionary
  sources are stripped the same way, so "u.s." in the file matches "u.s." (and "u.s") in the text.
* Lookup key: the core, lower-cased when `lowercase` (Python's `str.lower`; the bundled and induced
  lexicons are lowercase), then normalised with the source task's text normaliser
  (`flax_xalign.data.vocab.normalize`, e.g. "nfd_strip_marks"), so accented text matches an unaccented
  lexicon exactly as its tokens will; without one, matching is accent-exact (polytonic Greek's grave
  'καὶ' is not the acute 'καί'). Dictionary sources are keyed the same way, and sources that
  collide (e.g. "Word" and "word") pool their translations.
* The translation is inserted as written in the dictionary (no case restoration); the source task's
  normaliser then applies to the whole text during tokenisation, as it would without switching.
* Several translations: one is chosen uniformly. Words are re-joined with single spaces; a text
  with no switched word is returned byte for byte.

Randomness: each example draws two uniforms per word, u (switch if u < rate and the word is
translatable) and v (translation number floor(v * n)), from `tf.random.stateless_uniform` (Philox)
seeded by (seed, FarmHash64 of the example's text). The draw depends only on the seed and the text,
never on the position in the stream, the shuffle, the shard or the epoch: reruns and shards agree, and
a sentence is switched the same way every epoch (a fixed code-switched corpus per seed; pick another
seed for another draw). Identical sentences are switched identically. `switch_words` consumes a
`rng.random()` source in the same order (u, v for each word), so replaying `example_uniforms` through
it reproduces the map word for word.
"""

from __future__ import annotations

import functools
import os
import unicodedata
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from flax_xalign import errors
from flax_xalign.data.vocab import normalize as normalize_lib
from flax_xalign.fileio import utf8_lines

WORD_START = "\u2581"  # SentencePiece's word-start marker '▁'.
WORDPIECE_CONTINUATION = "##"
ASCII_WHITESPACE = " \t\n\v\f\r"
_BLI_HEADER = ("src", "tgt", "score")
# RE2: leading punctuation/symbols, the core (lazy), trailing punctuation/symbols.
_AFFIXES = r"(?s)^([\p{P}\p{S}]*)(.*?)([\p{P}\p{S}]*)$"
Dictionary = dict[str, tuple[str, ...]]


# ---------------------------------------------------------------- reading


def _entry(path: str, number: int, line: str) -> tuple[str, str, bool]:
  """(source, target, pieces) of one data line; pieces: a bli line (SentencePiece pieces)."""
  fields = line.split("\t") if "\t" in line else line.split()
  fields = [f.strip() for f in fields]
  if len(fields) == 3 and "\t" in line:
    try:
      float(fields[2])
    except ValueError:
      raise errors.UserError(
          f"{path}:{number}: the third column {fields[2]!r} is not a score; a bli dictionary "
          "line is 'source<TAB>target<TAB>score'.") from None
  elif len(fields) != 2:
    raise errors.UserError(
        f"{path}:{number}: expected 'source target' (MUSE) or 'source<TAB>target<TAB>score' "
        f"(xalign bli), found {len(fields)} fields: {line!r}.")
  if not fields[0] or not fields[1]:
    raise errors.UserError(
        f"{path}:{number}: the {'source' if not fields[0] else 'target'} column is empty; every "
        "line needs a source and a target word.")
  return fields[0], fields[1], len(fields) == 3


def _piece_word(piece: str, wordpiece: bool) -> str:
  """The word a word-start piece spells; "" for a word-internal piece (or the bare '▁')."""
  if wordpiece:
    return "" if piece.startswith(WORDPIECE_CONTINUATION) else piece
  return piece[len(WORD_START):] if piece.startswith(WORD_START) else ""


def read_bilingual_dictionary(path: str, *, log: Callable[[str], Any] = print) -> Dictionary:
  """Reads a MUSE or bli dictionary file (see the module docstring).

  Returns:
    source word -> its distinct translations in file order (first-seen sources first).

  Raises:
    UserError: a missing file, bad UTF-8, a malformed line (with file:line), or no usable entry.
  """
  if not os.path.isfile(path):
    raise errors.UserError(
        f"Dictionary file {path} does not exist (working directory {os.getcwd()}); write one in "
        "MUSE format ('source target' per line) or with `xalign bli --output=...`.")
  entries = []
  first = True
  for number, line in utf8_lines(path, what="the dictionary"):
    stripped = line.strip()
    if not stripped or stripped == "#" or stripped.startswith(("# ", "#\t")):
      continue  # Not any '#' start: '##' begins WordPiece continuation pieces.
    if first and tuple(f.strip().lower() for f in line.split("\t")) == _BLI_HEADER:
      first = False
      continue
    first = False
    entries.append(_entry(path, number, line))
  # Piece lines mark word starts with '▁' (SentencePiece); with no '▁' anywhere but '##'
  # continuations, the vocabulary is a WordPiece one, whose unmarked pieces start words.
  wordpiece = (not any(p and (s.startswith(WORD_START) or t.startswith(WORD_START)) for s, t, p in entries)
               and any(p and (s.startswith(WORDPIECE_CONTINUATION) or t.startswith(WORDPIECE_CONTINUATION))
                       for s, t, p in entries))
  marker = f"'{WORDPIECE_CONTINUATION}' continuations" if wordpiece else f"no leading '{WORD_START}'"
  translations: dict[str, list[str]] = {}
  pairs = internal = 0
  for source, target, pieces in entries:
    if pieces:
      source, target = _piece_word(source, wordpiece), _piece_word(target, wordpiece)
      if not source or not target:
        internal += 1
        continue
    known = translations.setdefault(source, [])
    if target not in known:
      known.append(target)
      pairs += 1
  if not translations:
    why = f"all {internal} entries are word-internal pieces ({marker})" if internal else "it holds no entry"
    raise errors.UserError(
        f"Dictionary file {path} is empty: {why}; it needs 'source target' lines.")
  skipped = f"; skipped {internal} word-internal piece pairs ({marker})" if internal else ""
  log(f"dictionary {path}: {pairs} pairs over {len(translations)} source words{skipped}")
  return {source: tuple(targets) for source, targets in translations.items()}


@functools.lru_cache(maxsize=8)
def _read_cached(path: str, mtime_ns: int, size: int) -> tuple[tuple[str, tuple[str, ...]], ...]:
  del mtime_ns, size  # Cache keys only: an edited file is read again.
  return tuple(read_bilingual_dictionary(path).items())


def cached_dictionary(path: str) -> Dictionary:
  """`read_bilingual_dictionary(path)`, read (and reported) once per process and file version."""
  try:
    stat = os.stat(path)
  except FileNotFoundError:
    return read_bilingual_dictionary(path)  # Raises the UserError.
  return dict(_read_cached(path, stat.st_mtime_ns, stat.st_size))


# ------------------------------------------------------ Python reference


def split_words(text: str) -> list[str]:
  """Words of `text`: runs between ASCII whitespace (`tf.strings.split`'s rule)."""
  words, start = [], None
  for i, c in enumerate(text):
    if c in ASCII_WHITESPACE:
      if start is not None:
        words.append(text[start:i])
      start = None
    elif start is None:
      start = i
  if start is not None:
    words.append(text[start:])
  return words


def _is_affix(c: str) -> bool:
  return unicodedata.category(c)[0] in "PS"


def split_affixes(word: str) -> tuple[str, str, str]:
  """(leading punctuation/symbols, core, trailing punctuation/symbols) of a word."""
  start, end = 0, len(word)
  while start < end and _is_affix(word[start]):
    start += 1
  while end > start and _is_affix(word[end - 1]):
    end -= 1
  return word[:start], word[start:end], word[end:]


def lookup_key(word: str, *, lowercase: bool = True, normalize: str = "") -> str:
  """The key a word (or a dictionary source) is looked up by; "" never matches."""
  core = split_affixes(word)[1]
  return normalize_lib.normalize_text(core.lower() if lowercase else core, normalize)


def keyed_dictionary(dictionary: Dictionary, *, lowercase: bool = True, normalize: str = "") -> Dictionary:
  """The dictionary by lookup key: colliding sources pool their translations (first-seen order)."""
  keyed: dict[str, list[str]] = {}
  for source, targets in dictionary.items():
    key = lookup_key(source, lowercase=lowercase, normalize=normalize)
    if key:
      known = keyed.setdefault(key, [])
      known.extend(t for t in targets if t not in known)
  return {key: tuple(targets) for key, targets in keyed.items()}


def switch_words(words: Sequence[str], dictionary: Dictionary, rate: float, rng: Any, *,
                 lowercase: bool = True, normalize: str = "") -> list[str]:
  """Reference code-switching of a list of words (pure Python, slow; the map's specification).

  For every word, translatable or not, draws u = rng.random() then v = rng.random(); a translatable
  word with u < rate becomes prefix + translations[floor(v * n)] + suffix (n translations).

  Args:
    words: the words of one text (`split_words`).
    dictionary: source -> translations, as read (`read_bilingual_dictionary`).
    rate: switching probability of a translatable word, in [0, 1].
    rng: anything with `.random()` in [0, 1) (`random.Random`, `numpy.random.Generator`).
    lowercase, normalize: the lookup rules (module docstring).
  """
  out = []
  for word in words:
    u, v = float(rng.random()), float(rng.random())
    prefix, core, suffix = split_affixes(word)
    key = normalize_lib.normalize_text(core.lower() if lowercase else core, normalize)
    translations = [t for source, targets in dictionary.items()
                    if key and lookup_key(source, lowercase=lowercase, normalize=normalize) == key
                    for t in targets]
    translations = list(dict.fromkeys(translations))
    if translations and u < rate:
      word = prefix + translations[min(int(v * len(translations)), len(translations) - 1)] + suffix
    out.append(word)
  return out


# ------------------------------------------------------------ tf.data map


class SwitchTables(NamedTuple):
  """The dictionary as tensors: key -> row, and each row's translations in one flat list."""
  index: Any     # tf.lookup.StaticHashTable, tf.string key -> int64 row (-1: not in the dictionary)
  starts: Any    # [rows] int64 offset of the row's first translation in `flat`
  counts: Any    # [rows] int64 number of translations of the row (>= 1)
  flat: Any      # [sum(counts)] tf.string translations


def build_tables(dictionary: Dictionary, *, lowercase: bool = True, normalize: str = "",
                 where: str = "dictionary") -> SwitchTables:
  """Tensors for `switch_text_tf` (built in Python, eagerly, when a dataset is built)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  keyed = keyed_dictionary(dictionary, lowercase=lowercase, normalize=normalize)
  if not keyed:
    raise errors.UserError(
        f"{where}: no source word is left once punctuation is set aside; the dictionary needs "
        "'source target' lines with words as sources.")
  counts = [len(targets) for targets in keyed.values()]
  starts = [0]
  for count in counts[:-1]:
    starts.append(starts[-1] + count)
  index = tf.lookup.StaticHashTable(
      tf.lookup.KeyValueTensorInitializer(tf.constant(list(keyed), tf.string),
                                          tf.range(len(keyed), dtype=tf.int64)), default_value=-1)
  return SwitchTables(index=index, starts=tf.constant(starts, tf.int64), counts=tf.constant(counts, tf.int64),
                      flat=tf.constant([t for targets in keyed.values() for t in targets], tf.string))


def example_uniforms(text: Any, seed: int, num_words: Any) -> Any:
  """[num_words, 2] float32 (u, v) per word, a function of (seed, text) only (Philox, stateless)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  fingerprint = tf.strings.to_hash_bucket_fast(text, 2**63 - 1)  # FarmHash64: stable everywhere.
  key = tf.stack([tf.constant(seed, tf.int64), fingerprint])
  return tf.random.stateless_uniform(tf.stack([tf.cast(num_words, tf.int32), 2]), seed=key, alg="philox")


def switch_text_tf(text: Any, tables: SwitchTables, *, rate: float, seed: int, lowercase: bool = True,
                   normalize: str = "") -> Any:
  """Code-switches one tf.string scalar (the rules of `switch_words`, draws of `example_uniforms`)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  words = tf.strings.split(text)                                         # [n]
  prefix, core, suffix = (tf.strings.regex_replace(words, _AFFIXES, rf"\{i}") for i in (1, 2, 3))
  key = normalize_lib.normalize_tf(core, normalize_lib.LOWER) if lowercase else core
  key = normalize_lib.normalize_tf(key, normalize)
  row = tables.index.lookup(key)                                         # [n] int64, -1 unknown
  draws = tf.cast(example_uniforms(text, seed, tf.size(words)), tf.float64)  # [n, 2]
  # float64: u < rate and floor(v * n) exactly as the reference computes them on Python floats.
  switch = (row >= 0) & (draws[:, 0] < rate)
  safe = tf.maximum(row, 0)
  count = tf.gather(tables.counts, safe)
  pick = tf.minimum(tf.cast(tf.floor(draws[:, 1] * tf.cast(count, tf.float64)), tf.int64), count - 1)
  translation = tf.gather(tables.flat, tf.gather(tables.starts, safe) + pick)
  switched = tf.where(switch, prefix + translation + suffix, words)
  return tf.where(tf.reduce_any(switch), tf.strings.reduce_join(switched, separator=" "), text)


def check_rate(rate: Any, *, where: str) -> float:
  """`rate` as a float in [0, 1]; UserError otherwise."""
  if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 <= rate <= 1.0:
    raise errors.UserError(
        f"{where}: rate={rate!r} must be a number in [0, 1], the probability that a translatable "
        "word is switched (e.g. 0.15).")
  return float(rate)


def code_switch_preprocessor(dataset: Any, *, dictionary_path: str, rate: float, seed: int = 0,
                             lowercase: bool = True, normalize: str = "", feature: str = "text") -> Any:
  """seqio preprocessor: code-switches the `feature` text of every example (before tokenisation).

  The dictionary is read (once per process and file version) when the dataset is built; other
  features pass through unchanged.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  rate = check_rate(rate, where=f"code-switching by {dictionary_path}")
  normalize_lib.check_normalizer(normalize)
  tables = build_tables(cached_dictionary(dictionary_path), lowercase=lowercase, normalize=normalize,
                        where=dictionary_path)

  def fn(ex):
    text = switch_text_tf(ex[feature], tables, rate=rate, seed=seed, lowercase=lowercase, normalize=normalize)
    return {**ex, feature: text}

  return dataset.map(fn, num_parallel_calls=tf.data.AUTOTUNE)
