r"""Bilingual word lexicons in MUSE format, and the shipped Greek->English one.

    xalign lexicon --output=grc-en.train.txt [--min_count=2] [--split=train]

MUSE format: one `source target` pair per line, the two words separated by
white space; a source with several translations has several lines.
`read_lexicon` reads it (blank lines skipped) into `{source: [target, ...]}`.

The shipped gold lexicon `lexicons/grc-en.train.txt` (the BLI gold of
`xalign bli --gold=...`; `SHIPPED_GREEK_ENGLISH`) is built by
`greek_english_lexicon` from the manual SBLGNT-BSB word alignments of the
*training* books (`bible.gold_alignments("train")`), so nothing of the
validation or test books leaks into it:

1. Every sure link (i, j) of every verse counts one (Greek word, English word)
   pair; a many-to-many group contributes its whole cross product. Both words
   are lowercased (`str.lower`, so final sigma and polytonic accents are kept).
   English tokens without a letter or digit (punctuation only) are dropped
   (`gold_alignments` already leaves punctuation out; this guards the rule).
2. Each Greek word gets the English word it is linked to most often.
3. Ties go to the English word with the fewest links over the whole split (the
   more specific word: "man" before "a"), then to the smaller string in
   code-point order.
4. The entry is kept when that best count is at least `min_count` (default 2:
   a word aligned once is as likely an alignment accident as a translation).
5. Lines are sorted by the best count, descending, then by the Greek word.

`lexicons/README.md` repeats this with the numbers and the data's licence.
"""

from __future__ import annotations

import collections
import os
import pathlib
import sys
from collections.abc import Iterable, Mapping, Sequence

from flax_xalign import errors
from flax_xalign import storage
from flax_xalign.data.sources import bible
LEXICON_DIR = pathlib.Path(__file__).resolve().parents[1] / "lexicons"
SHIPPED_GREEK_ENGLISH = LEXICON_DIR / "grc-en.train.txt"
MIN_COUNT = 2
_FORMAT = "one 'source target' pair per line (two words separated by white space)"

Pair = tuple[str, str]


def is_word(token: str) -> bool:
  """True when `token` has a letter or digit (punctuation-only tokens are not words)."""
  return any(ch.isalnum() for ch in token)


def count_links(alignments: Iterable[bible.GoldAlignment]) -> dict[str, collections.Counter]:
  """{greek word: Counter(english word: links)} over the sure links, both sides lowercased."""
  counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
  for verse in alignments:
    for i, j in verse.sure:
      greek, english = verse.greek[i].lower(), verse.english[j].lower()
      if is_word(greek) and is_word(english):
        counts[greek][english] += 1
  return dict(counts)


def most_frequent_translations(counts: Mapping[str, Mapping[str, int]], *, min_count: int = MIN_COUNT
                               ) -> list[tuple[str, str, int]]:
  """(source, its most linked target, count), ties and order as in the module docstring.

  Args:
    counts: {source word: {target word: links}}.
    min_count: smallest best count kept (>= 1).

  Returns:
    Sorted by count descending, then source word.
  """
  if min_count < 1:
    raise errors.UserError(f"min_count={min_count} must be at least 1.")
  target_totals: collections.Counter = collections.Counter()
  for targets in counts.values():
    target_totals.update(targets)
  rows = []
  for source, targets in counts.items():
    best = min(targets, key=lambda t: (-targets[t], target_totals[t], t))
    if targets[best] >= min_count:
      rows.append((source, best, targets[best]))
  return sorted(rows, key=lambda row: (-row[2], row[0]))


def greek_english_lexicon(split: str = "train", *, min_count: int = MIN_COUNT,
                          data_dir: bible.DataDir = None) -> list[tuple[str, str, int]]:
  """The Greek->English lexicon of a split's manual alignments: (greek, english, links) rows."""
  return most_frequent_translations(count_links(bible.gold_alignments(split, data_dir=data_dir)),
                                    min_count=min_count)


def format_lexicon(pairs: Iterable[Sequence[str]]) -> str:
  """MUSE text of (source, target, ...) rows; extra fields (counts) are left out."""
  lines = []
  for row in pairs:
    source, target = row[0], row[1]
    if not source or not target or any(ch.isspace() for ch in source + target):
      raise ValueError(f"lexicon words cannot be empty or hold white space: {source!r} {target!r}")
    lines.append(f"{source} {target}\n")
  return "".join(lines)


def read_lexicon(path: str | os.PathLike) -> dict[str, list[str]]:
  """{source: [target, ...]} of a MUSE-format file, in file order, duplicates dropped.

  Raises:
    UserError: the file is missing, not UTF-8, empty, or has a line that is not
      exactly two white-space separated words (named as `path:line`).
  """
  path = os.fspath(path)
  if not storage.isfile(path):
    raise errors.UserError(f"lexicon {path} does not exist; pass a UTF-8 file with {_FORMAT}.")
  try:
    lines = storage.read_text(path).splitlines()
  except UnicodeDecodeError as e:
    raise errors.UserError(f"lexicon {path} is not UTF-8 ({e}).") from e
  lexicon: dict[str, list[str]] = {}
  for number, line in enumerate(lines, start=1):
    if not line.strip():
      continue
    fields = line.split()
    if len(fields) != 2:
      raise errors.UserError(f"{path}:{number}: malformed line {line[:60]!r}; expected {_FORMAT}.")
    targets = lexicon.setdefault(fields[0], [])
    if fields[1] not in targets:
      targets.append(fields[1])
  if not lexicon:
    raise errors.UserError(f"lexicon {path} has no entries; expected {_FORMAT}.")
  return lexicon


