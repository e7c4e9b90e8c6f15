"""The embedded corpus: Greek NT, English Bible and manual word alignments.

Everything comes from one PyPI wheel, `bible-alignments==0.4.2`, fetched with
`pip download` into `<data_dir>/bible_alignments/` and read as a zip (never
installed: it pins Python < 3.12 and installs a top-level `data/` package).

* English: the Berean Standard Bible (BSB), OT + NT, one token per row of
  `data/eng/targets/BSB/{ot,nt}_BSB.tsv`. Verse text is rebuilt by joining the
  tokens with a space, except after a token flagged `skip_space_after`
  (opening quotes, words before punctuation). The
  `exclude` column only flags punctuation (never aligned); punctuation stays in
  the text but is left out of the word lists of `gold_alignments`.
* Greek: SBLGNT, one word per row of `data/sources/SBLGNT.tsv` with gold POS.
  The file carries no punctuation; verse text is the words joined by spaces.
* Gold alignments: `data/eng/alignments/BSB/SBLGNT-BSB-manual.json`, manual
  many-to-many groups; sure links are the cross product inside each group.

Verse ids are 8-digit strings `BBCCCVVV` (`"40001001"` = Matthew 1:1).

Bitext. Every BSB NT token names the Greek verse it translates
(`source_verse`). English tokens are grouped by that id and paired with the
SBLGNT verse of the same id, so a few English verses that the BSB numbers
differently (Acts 19:41 -> Greek 19:40) land with the Greek they translate.
The `id_range_end` / `source_verse_range_end` columns are empty in every row of
0.4.2, so no range expansion is needed; `_check_no_ranges` fails loudly if a
future wheel fills them. Verses with only one side (Rom 16:24, 3 John 15,
Rev 12:18 on the Greek side; Rom 16:25-27, 2 Cor 13:14 in BSB numbering) are
dropped from the bitext. Gold links whose words fall in different verses (80 of
115,008 groups straddle a verse boundary) keep only the pairs inside the verse.

Split (whole books; OT books 1-39 are all train):

=========== =========================================== ======== ========
split       NT books                                    grc tok  % of grc
=========== =========================================== ======== ========
validation  47 2 Corinthians, 48 Galatians, 58 Hebrews    11,634   8.4 %
test        41 Mark, 50 Philippians, 59 James             14,651  10.6 %
train       the other 21 NT books                        111,456  80.9 %
=========== =========================================== ======== ========

English tokens (punctuation included): train 803,256 (OT 641,966 + NT
161,290), validation 18,154, test 21,692. Verses (train / validation / test):
English 29,608 / 709 / 885 (English numbering, OT included); Greek 6,346 /
708 / 885; bitext 6,343 / 708 / 885; gold-aligned 6,330 / 705 / 884.

Licences (kept with anything derived from this data): see `LICENSE_NOTICE`.
"""

import collections
import dataclasses
import functools
import itertools
import json
import pathlib
import re
from typing import (Dict, FrozenSet, Iterable, List, NamedTuple, Optional,
                    Tuple, Union)

from flax_xalign import errors
from flax_xalign.data.sources import wheels
WHEEL = wheels.PinnedWheel(
    package="bible-alignments==0.4.2", filename="bible_alignments-0.4.2-py3-none-any.whl",
    sha256="84f6b15e706657777824aac811567cb5cb2b38ad2b94497209f5f3c3f67b0984",
    subdir="bible_alignments", size="8.8 MB")
PACKAGE_SPEC = WHEEL.package
WHEEL_NAME = WHEEL.filename
WHEEL_SHA256 = WHEEL.sha256
WHEEL_SUBDIR = WHEEL.subdir

LICENSE_NOTICE = """\
Derived from the Bible Word Alignments wheel (bible-alignments 0.4.2, data (c)
2022 Clear Bible, Inc, CC BY 4.0, https://github.com/Clear-Bible/Alignments):
* Greek text: SBLGNT, Copyright 2010 by the Society of Biblical Literature and
  Logos Bible Software, CC BY 4.0, https://sblgnt.com/ ; MACULA Greek
  Linguistic Datasets, https://github.com/Clear-Bible/macula-greek/ (CC BY 4.0).
* English text: Berean Standard Bible (BSB), public domain,
  https://www.bereanbible.com/
* Alignments: SBLGNT-BSB-manual (Biblica), CC BY 4.0.
"""

SPLITS = ("train", "validation", "test")
VALIDATION_BOOKS: FrozenSet[int] = frozenset({47, 48, 58})
TEST_BOOKS: FrozenSet[int] = frozenset({41, 50, 59})
FIRST_NT_BOOK = 40
LAST_BOOK = 66

_ENGLISH_MEMBERS = ("data/eng/targets/BSB/ot_BSB.tsv",
                    "data/eng/targets/BSB/nt_BSB.tsv")
_GREEK_MEMBER = "data/sources/SBLGNT.tsv"
_ALIGNMENT_MEMBER = "data/eng/alignments/BSB/SBLGNT-BSB-manual.json"


class GoldAlignment(NamedTuple):
  """Manual word alignment of one verse.

  Attributes:
    verse_id: the Greek verse id, `BBCCCVVV`.
    greek: the Greek words of the verse, in order.
    english: the English words (punctuation left out) that translate it.
    sure: sorted `(i, j)` pairs: `greek[i]` is aligned with `english[j]`.
  """
  verse_id: str
  greek: Tuple[str, ...]
  english: Tuple[str, ...]
  sure: Tuple[Tuple[int, int], ...]


# ------------------------------------------------------------------ the wheel


sha256_of = wheels.sha256_of


def pip_download_command(directory: pathlib.Path) -> List[str]:
  """The command that fetches the wheel into `directory`."""
  return WHEEL.pip_download_command(directory)


def ensure_wheel(data_dir: Optional[Union[str, pathlib.Path]] = None
                 ) -> pathlib.Path:
  """Returns the path of the verified corpus wheel, downloading it if absent.

  Args:
    data_dir: the data directory; `paths.data_dir()` when None.

  Returns:
    `<data_dir>/bible_alignments/bible_alignments-0.4.2-py3-none-any.whl`.

  Raises:
    UserError: the download failed or the file's sha256 is wrong.
  """
  # Looked up at call time, so a test can replace pip_download_command.
  return WHEEL.ensure(data_dir, command=lambda d: pip_download_command(d))


_read_member = wheels.read_member


# ------------------------------------------------------------------ parsing

# id, source_verse, text, skip_space_after, exclude, then the two range columns,
# which must be empty (see the module docstring).
_ENGLISH_ROW = re.compile(r"^(\d{11})\t(\d{8})\t([^\t\n]*)\t(y?)\t(y?)\t\t\r?$",
                          re.MULTILINE)
# id, altId, text, strongs, gloss, gloss2, lemma, pos, morph.
_GREEK_ROW = re.compile(
    r"^n(\d{11})\t[^\t\n]*\t([^\t\n]*)\t(?:[^\t\n]*\t){4}([^\t\n]*)\t",
    re.MULTILINE)

# (token id, source verse, text, skip_space_after "y"|"", exclude "y"|"").
_EnglishRow = Tuple[str, str, str, str, str]


def _member_rows(wheel: pathlib.Path, member: str,
                 pattern: "re.Pattern[str]") -> List[Tuple[str, ...]]:
  """All data rows of a TSV member, parsed by `pattern` (header dropped)."""
  text = _read_member(wheel, member).decode("utf-8")
  rows = pattern.findall(text)
  expected = sum(1 for line in text.split("\n")[1:] if line.strip())
  if len(rows) != expected:
    raise NotImplementedError(
        f"{member} in {wheel.name}: {expected - len(rows)} rows do not have "
        "the layout this reader expects (e.g. a filled verse-range column).")
  return rows


@dataclasses.dataclass(frozen=True)
class _Corpus:
  english: Tuple[_EnglishRow, ...]                 # OT + NT, in id order
  greek: Dict[str, List[Tuple[str, str, str]]]     # verse -> (id, word, pos)


@functools.lru_cache(maxsize=2)
def _corpus(wheel: pathlib.Path) -> _Corpus:
  english = []
  for member in _ENGLISH_MEMBERS:
    english.extend(_member_rows(wheel, member, _ENGLISH_ROW))
  greek = collections.defaultdict(list)
  for row in _member_rows(wheel, _GREEK_MEMBER, _GREEK_ROW):
    greek[row[0][:8]].append(row)
  return _Corpus(english=tuple(english), greek=dict(greek))


def _join(rows: Iterable[_EnglishRow]) -> str:
  """Running text: a space after each token unless `skip_space_after`."""
  return "".join(text if skip else text + " "
                 for _, _, text, skip, _ in rows).rstrip()


@functools.lru_cache(maxsize=2)
def _english_by_source(wheel: pathlib.Path) -> Dict[str, List[_EnglishRow]]:
  """NT English rows grouped by the Greek verse they translate."""
  groups = collections.defaultdict(list)
  for row in _corpus(wheel).english:
    if row[0] >= "40":
      groups[row[1]].append(row)
  return dict(groups)


@functools.lru_cache(maxsize=4)
def _english_texts(key: str, wheel: pathlib.Path) -> Dict[str, str]:
  """Verse texts by English verse (`"id"`) or by Greek verse (`"source"`)."""
  if key == "source":
    return {verse: _join(rows)
            for verse, rows in _english_by_source(wheel).items()}
  return {verse: _join(rows) for verse, rows in itertools.groupby(
      _corpus(wheel).english, key=lambda row: row[0][:8])}


def _check_split(split: str) -> None:
  if split not in SPLITS:
    raise errors.UserError(
        f"Unknown split {split!r} of the embedded Bible corpus; use one of "
        f"{', '.join(SPLITS)}.")


def book_split(book: int) -> str:
  """The split ("train", "validation" or "test") of book number 1-66."""
  if not 1 <= int(book) <= LAST_BOOK:
    raise errors.UserError(
        f"Book number {book} is outside 1..{LAST_BOOK} (Genesis=1, "
        "Matthew=40, Revelation=66).")
  if book in VALIDATION_BOOKS:
    return "validation"
  if book in TEST_BOOKS:
    return "test"
  return "train"


def _verse_split(verse_id: str) -> str:
  return book_split(int(verse_id[:2]))


# ------------------------------------------------------------------ public API
#
# Every reader takes `data_dir` (default `paths.data_dir()`), fetching the wheel
# on first use; parsed data is cached per process and wheel path.

DataDir = Optional[Union[str, pathlib.Path]]


def english_verses(split: str, *, data_dir: DataDir = None
                   ) -> List[Tuple[str, str]]:
  """English (BSB) verses of a split, in canonical order.

  Args:
    split: one of `SPLITS`.
    data_dir: the data directory holding (or receiving) the wheel.

  Returns:
    `(verse_id, text)` pairs keyed by the English verse numbering.
  """
  _check_split(split)
  texts = _english_texts("id", ensure_wheel(data_dir))
  return [(verse, text) for verse, text in texts.items()
          if _verse_split(verse) == split]


def greek_tokens(split: str, *, data_dir: DataDir = None
                 ) -> List[Tuple[str, List[Tuple[str, str]]]]:
  """Greek (SBLGNT) words with gold POS: `(verse_id, [(word, pos), ...])`."""
  _check_split(split)
  greek = _corpus(ensure_wheel(data_dir)).greek
  return [(verse, [(word, pos) for _, word, pos in greek[verse]])
          for verse in sorted(greek) if _verse_split(verse) == split]


def greek_verses(split: str, *, data_dir: DataDir = None
                 ) -> List[Tuple[str, str]]:
  """Greek (SBLGNT) verses of a split: `(verse_id, text)`."""
  return [(verse, " ".join(word for word, _ in words))
          for verse, words in greek_tokens(split, data_dir=data_dir)]


def bitext(split: str, *, data_dir: DataDir = None
           ) -> List[Tuple[str, str, str]]:
  """Verse-aligned Greek-English pairs: `(verse_id, grc_text, en_text)`."""
  _check_split(split)
  english = _english_texts("source", ensure_wheel(data_dir))
  return [(verse, grc, english[verse])
          for verse, grc in greek_verses(split, data_dir=data_dir)
          if verse in english]


def gold_alignments(split: str, *, data_dir: DataDir = None
                    ) -> List[GoldAlignment]:
  """Manual Greek-English word alignments of the split's bitext verses.

  Word lists: all Greek words of the verse; the English non-punctuation tokens
  whose `source_verse` is the verse. Verses without any link are left out.

  Args:
    split: one of `SPLITS`.
    data_dir: the data directory holding (or receiving) the wheel.

  Returns:
    One `GoldAlignment` per verse, in canonical order.
  """
  _check_split(split)
  wheel = ensure_wheel(data_dir)
  corpus = _corpus(wheel)
  links = _links_by_verse(wheel)
  english = _english_by_source(wheel)
  result = []
  for verse in sorted(links):
    if _verse_split(verse) != split or verse not in english:
      continue
    greek_ids = {tid: i for i, (tid, _, _) in enumerate(corpus.greek[verse])}
    words = [row for row in english[verse] if not row[4]]
    english_ids = {row[0]: j for j, row in enumerate(words)}
    sure = sorted({(greek_ids[s], english_ids[t]) for s, t in links[verse]
                   if s in greek_ids and t in english_ids})
    if sure:
      result.append(GoldAlignment(
          verse_id=verse,
          greek=tuple(word for _, word, _ in corpus.greek[verse]),
          english=tuple(row[2] for row in words), sure=tuple(sure)))
  return result


@functools.lru_cache(maxsize=2)
def _links_by_verse(wheel: pathlib.Path) -> Dict[str, List[Tuple[str, str]]]:
  """Cross products of the manual groups, keyed by the Greek word's verse."""
  records = json.loads(_read_member(wheel, _ALIGNMENT_MEMBER))["records"]
  links = collections.defaultdict(list)
  for record in records:
    for source in record["source"]:
      source = source.lstrip("n")
      for target in record["target"]:
        links[source[:8]].append((source, target))
  return dict(links)
