"""Readers for users' own downstream data: POS, NER and sentence pairs.

Each reader returns plain Python lists and raises `errors.UserError` naming
`file:line` for a malformed line, so a bad row in a large file is found at once.

* `read_conllu_pos`: Universal Dependencies CoNLL-U (10 tab-separated columns;
  `#` comments; blank line between sentences). Multiword-token ranges (`1-2`)
  and empty nodes (`1.1`) are skipped, so the words are the syntactic words
  that UD's UPOS/XPOS annotate. HEAD/DEPREL are not read (see
  `flax_xalign.data.transforms.syntax.read_conllu` for the trees).
* `read_conll_ner`: CoNLL-2003 style, one token per line with the tag in the
  last whitespace-separated column, a blank line between sentences and
  `-DOCSTART-` lines skipped. Tags must be BIO: `O`, `B-TYPE` or `I-TYPE`
  (IOB1 files, where a span may open with `I-`, are accepted as they are).
* `read_xnli_tsv`: XNLI's `.tsv` (a header row naming the columns, tab
  separated, no quoting), or a headerless `premise<TAB>hypothesis<TAB>label`
  file with `has_header=False`.

Files are read as UTF-8; a leading byte-order mark and `\\r\\n` line ends are
tolerated.
"""

from collections.abc import Iterator
import os
from typing import NamedTuple, Union

from flax_xalign import errors

PathLike = Union[str, os.PathLike]

POS_COLUMNS = {"upos": 3, "xpos": 4}
CONLLU_COLUMNS = 10
DOCSTART = "-DOCSTART-"


class TaggedSentence(NamedTuple):
  """One sentence with one tag per word.

  Attributes:
    words: the words, in order.
    tags: the tags, `len(tags) == len(words)`.
  """
  words: tuple[str, ...]
  tags: tuple[str, ...]


class SentencePairExample(NamedTuple):
  """One sentence-pair classification example (XNLI-style).

  Attributes:
    premise: the first sentence.
    hypothesis: the second sentence.
    label: the gold label as written in the file (e.g. `entailment`).
  """
  premise: str
  hypothesis: str
  label: str


def numbered_lines(path: PathLike) -> Iterator[tuple[int, str]]:
  """Yields `(line_number, line)` of a UTF-8 text file, line ends removed.

  Args:
    path: the file.

  Yields:
    1-based line numbers and the line without its trailing `\\n` / `\\r\\n`.

  Raises:
    UserError: the file is missing or is not UTF-8.
  """
  try:
    with open(path, encoding="utf-8-sig") as f:
      for number, line in enumerate(f, start=1):
        yield number, line.rstrip("\r\n")
  except FileNotFoundError:
    raise errors.UserError(
        f"{path}: no such file. Check the path.") from None
  except IsADirectoryError:
    raise errors.UserError(
        f"{path}: is a directory; pass the data file inside it.") from None
  except UnicodeDecodeError as e:
    raise errors.UserError(
        f"{path}:{_first_undecodable_line(path)}: not valid UTF-8 "
        f"({e.reason}). Re-encode the file as UTF-8 (e.g. `iconv -t "
        "UTF-8`).") from None


def _first_undecodable_line(path: PathLike) -> int:
  # The text decoder reads ahead in blocks, so the line an error surfaces at
  # is not the line at fault; find it from the bytes.
  number = 0
  with open(path, "rb") as f:
    for number, raw in enumerate(f, start=1):
      try:
        raw.decode("utf-8")
      except UnicodeDecodeError:
        return number
  return number


def read_conllu_pos(path: PathLike, *, column: str = "upos"
                    ) -> list[TaggedSentence]:
  """Reads words and POS tags from a CoNLL-U file.

  Args:
    path: the `.conllu` file.
    column: `"upos"` (universal tags, column 4) or `"xpos"` (language-specific
      tags, column 5).

  Returns:
    One `TaggedSentence` per sentence, in file order.

  Raises:
    UserError: an unknown column name, or a malformed line (wrong column
      count, a non-integer ID, an empty tag).
  """
  if column not in POS_COLUMNS:
    raise errors.UserError(
        f"read_conllu_pos: unknown column {column!r}; use one of "
        f"{sorted(POS_COLUMNS)}.")
  tag_index = POS_COLUMNS[column]
  sentences = []
  words, tags = [], []
  for number, line in numbered_lines(path):
    if not line.strip():
      if words:
        sentences.append(TaggedSentence(tuple(words), tuple(tags)))
      words, tags = [], []
      continue
    if line.startswith("#"):
      continue
    fields = line.split("\t")
    where = f"{path}:{number}"
    if len(fields) != CONLLU_COLUMNS:
      raise errors.UserError(
          f"{where}: expected {CONLLU_COLUMNS} tab-separated CoNLL-U columns, "
          f"found {len(fields)}. Separate columns with tabs, not spaces.")
    word_id = fields[0]
    if "-" in word_id or "." in word_id:
      continue  # Multiword-token range or empty node: no POS of its own.
    if not word_id.isdigit():
      raise errors.UserError(
          f"{where}: ID {word_id!r} is not an integer, a range (1-2) or an "
          "empty node (1.1).")
    tag = fields[tag_index]
    if not tag or tag == "_":
      other = "xpos" if column == "upos" else "upos"
      raise errors.UserError(
          f"{where}: no {column.upper()} tag for {fields[1]!r}. Tag every "
          f"word, or read the other column (column={other!r}).")
    words.append(fields[1])
    tags.append(tag)
  if words:
    sentences.append(TaggedSentence(tuple(words), tuple(tags)))
  return sentences


def _is_bio(tag: str) -> bool:
  return tag == "O" or (len(tag) > 2 and tag[:2] in ("B-", "I-"))


def read_conll_ner(path: PathLike) -> list[TaggedSentence]:
  """Reads a CoNLL-2003 style NER file.

  Each non-blank line is `token [other columns ...] tag` separated by
  whitespace (spaces or tabs); the first column is the word and the last the
  tag. Blank lines end sentences; `-DOCSTART-` lines are skipped.

  Args:
    path: the file.

  Returns:
    One `TaggedSentence` per sentence, in file order.

  Raises:
    UserError: a line with fewer than two columns, or a tag that is not BIO.
  """
  sentences = []
  words, tags = [], []
  for number, line in numbered_lines(path):
    fields = line.split()
    if not fields:
      if words:
        sentences.append(TaggedSentence(tuple(words), tuple(tags)))
      words, tags = [], []
      continue
    if fields[0] == DOCSTART:
      continue
    if len(fields) < 2:
      raise errors.UserError(
          f"{path}:{number}: expected `token ... tag` (at least two "
          f"whitespace-separated columns), found {line!r}.")
    if not _is_bio(fields[-1]):
      raise errors.UserError(
          f"{path}:{number}: tag {fields[-1]!r} is not BIO; expected O, "
          "B-TYPE or I-TYPE in the last column (convert BIOES/BILOU tags "
          "to BIO first).")
    words.append(fields[0])
    tags.append(fields[-1])
  if words:
    sentences.append(TaggedSentence(tuple(words), tuple(tags)))
  return sentences


def _header_indices(path: PathLike, number: int, header: list[str],
                    wanted: tuple[str, ...]) -> list[int]:
  missing = [name for name in wanted if name not in header]
  if missing:
    raise errors.UserError(
        f"{path}:{number}: the header has no column {missing[0]!r}; it has "
        f"{header}. Pass premise_column= / hypothesis_column= / "
        "label_column=, or has_header=False for a headerless "
        "premise<TAB>hypothesis<TAB>label file.")
  return [header.index(name) for name in wanted]


def read_xnli_tsv(path: PathLike, *, premise_column: str = "sentence1",
                  hypothesis_column: str = "sentence2",
                  label_column: str = "gold_label",
                  has_header: bool = True) -> list[SentencePairExample]:
  """Reads sentence pairs from an XNLI-style tab-separated file.

  Fields are split on tabs only (no quoting: XNLI's sentences contain `"`).
  Blank lines are skipped.

  Args:
    path: the `.tsv` file.
    premise_column: header name of the first sentence.
    hypothesis_column: header name of the second sentence.
    label_column: header name of the label.
    has_header: False for a headerless file of exactly three columns,
      `premise, hypothesis, label`; the column names are then ignored.

  Returns:
    One `SentencePairExample` per data row, in file order.

  Raises:
    UserError: a missing column in the header, or a row with the wrong
      number of fields or an empty label.
  """
  examples = []
  indices = [0, 1, 2] if not has_header else None
  width = 3 if not has_header else None
  for number, line in numbered_lines(path):
    if not line.strip():
      continue
    fields = line.split("\t")
    if indices is None:
      indices = _header_indices(
          path, number, fields,
          (premise_column, hypothesis_column, label_column))
      width = len(fields)
      continue
    if len(fields) != width:
      raise errors.UserError(
          f"{path}:{number}: expected {width} tab-separated fields, found "
          f"{len(fields)}. Check for a tab inside a sentence or a missing "
          "field" + ("" if has_header else
                     " (headerless files are premise<TAB>hypothesis<TAB>"
                     "label)") + ".")
    premise, hypothesis, label = (fields[i] for i in indices)
    if not label.strip():
      raise errors.UserError(f"{path}:{number}: empty label.")
    examples.append(SentencePairExample(premise, hypothesis, label.strip()))
  return examples
