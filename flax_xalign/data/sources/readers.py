"""Readers for users' own downstream data: POS, NER and sentence pairs.

Each reader returns plain Python lists and raises `errors.UserError` naming
`file:line` for a malformed line, so a bad row in a large file is found at once.

* `read_conllu_pos`: Universal Dependencies CoNLL-U (10 tab-separated columns;
  `#` comments; blank line between sentences). Multiword-token ranges (`1-2`)
  and empty nodes (`1.1`) are skipped, so the words are the syntactic words
  that UD's UPOS/XPOS annotate. HEAD/DEPREL are not read (see
  `flax_xalign.data.transforms.syntax.read_conllu` for the trees). Both read
  through `read_conllu_sentences`, the one CoNLL-U parser: the `conllu`
  package types the ID column and the comment metadata, and this module keeps
  the line numbers, the strict tab split and the columns as written.
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

from __future__ import annotations

from collections.abc import Iterable, Iterator
import os
from typing import TYPE_CHECKING, Callable, NamedTuple, Optional, Union

from flax_xalign import errors
from flax_xalign import storage

if TYPE_CHECKING:
  import conllu
# `conllu` is imported where a CoNLL-U file is parsed: every command's gin set-up imports this module
# (the transfer evaluator's configurables), and a host without conllu (a bare GPU machine) still trains.

PathLike = Union[str, os.PathLike]

# conllu's names of the ten columns (conllu.parser.DEFAULT_FIELDS; a test checks they agree).
CONLLU_FIELDS = ("id", "form", "lemma", "upos", "xpos", "feats", "head", "deprel", "deps", "misc")
CONLLU_COLUMNS = len(CONLLU_FIELDS)
# Column names `read_conllu_pos` accepts, with their 0-based index.
POS_COLUMNS = {"upos": CONLLU_FIELDS.index("upos"), "xpos": CONLLU_FIELDS.index("xpos")}
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
    with storage.open_file(path, encoding="utf-8-sig") as f:
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
  with storage.open_file(path, "rb") as f:
    for number, raw in enumerate(f, start=1):
      try:
        raw.decode("utf-8")
      except UnicodeDecodeError:
        return number
  return number


class ConlluSentence(NamedTuple):
  """One blank-line-separated block of a CoNLL-U file, as `conllu` types it.

  Attributes:
    tokens: every word line in order, multiword ranges and empty nodes
      included, as `conllu.Token`s keyed by `CONLLU_FIELDS`; `id` is conllu's
      parse (an int, `(1, "-", 2)` or `(1, ".", 1)`), every other column the
      string as written. `tokens.metadata` holds conllu's reading of the
      comments.
    line_numbers: `tokens[i]` was read from line `line_numbers[i]`.
    comments: the comment lines as written, `#` included.
    first_line: the block's first line (a comment or a word).
    last_line: its last line.
  """
  tokens: conllu.TokenList
  line_numbers: tuple[int, ...]
  comments: tuple[str, ...]
  first_line: int
  last_line: int


# check_word(token, "file:line", position of the word in its sentence).
WordCheck = Callable[["conllu.Token", str, int], None]


def is_syntactic_word(token: conllu.Token) -> bool:
  """False for multiword-token ranges (`1-2`) and empty nodes (`1.1`)."""
  return isinstance(token["id"], int)


def _conllu_token(line: str, where: str, *, allow_empty: bool) -> conllu.Token:
  # Split on tabs only: conllu's own line parser also splits on runs of two
  # spaces and accepts short lines, which would read a space-separated file or
  # a FORM with spaces column-shifted instead of refusing it at its line.
  import conllu.exceptions
  import conllu.parser

  values = line.split("\t")
  if len(values) != CONLLU_COLUMNS:
    raise errors.UserError(
        f"{where}: expected {CONLLU_COLUMNS} tab-separated CoNLL-U columns, "
        f"found {len(values)}. Separate columns with tabs, not spaces.")
  if not allow_empty and "" in values:
    raise errors.UserError(
        f"{where}: column {values.index('') + 1} is empty; write `_` for "
        "a missing value.")
  try:
    word_id = conllu.parser.parse_id_value(values[0])
  except conllu.exceptions.ParseException:
    word_id = None
  if word_id is None:
    raise errors.UserError(
        f"{where}: ID {values[0]!r} is not an integer, a range (1-2) or an "
        "empty node (1.1).")
  # The other columns stay strings: conllu's FEATS/MISC dicts and DEPS lists
  # do not always give back the text read (`A=B=C`, repeated keys).
  token = conllu.Token(zip(CONLLU_FIELDS, values))
  token["id"] = word_id
  return token


def read_conllu_sentences(path_or_lines: Union[PathLike, Iterable[str]], *,
                          allow_empty_columns: bool = True,
                          check_word: Optional[WordCheck] = None
                          ) -> Iterator[ConlluSentence]:
  """Parses CoNLL-U into sentences, naming `file:line` in every error.

  The one CoNLL-U parser of the package: `read_conllu_pos` and
  `data.transforms.syntax.read_conllu` pick their columns from it. Lines
  starting with `#` are comments; a blank (or all-space) line ends a sentence.

  Args:
    path_or_lines: a file path, or an iterable of lines (named `<lines>` in
      error messages).
    allow_empty_columns: False refuses an empty column (CoNLL-U writes `_`).
    check_word: called as `check_word(token, where, position)` on each
      syntactic word (not ranges or empty nodes) as soon as its line is read,
      with `where` the `file:line` and `position` its 1-based place among
      the sentence's words; it raises `UserError` for what the caller needs.
      Checking here, not after the sentence, keeps errors in line order.

  Yields:
    One `ConlluSentence` per block, in file order; a block of comments only
    has no tokens.

  Raises:
    UserError: the file is missing or not UTF-8, or a word line does not have
      10 tab-separated columns, has an empty column (when refused), or an ID
      that is not an integer, a range or an empty node.
  """
  if isinstance(path_or_lines, (str, os.PathLike)):
    name = os.fspath(path_or_lines)
    numbered = numbered_lines(path_or_lines)
  else:
    name = "<lines>"
    numbered = ((number, line.rstrip("\r\n"))
                for number, line in enumerate(path_or_lines, start=1))
  tokens, line_numbers, comments, first_line, words = [], [], [], None, 0
  number = 0
  for number, line in numbered:
    if not line.strip():
      if first_line is not None:
        yield _conllu_sentence(tokens, line_numbers, comments, first_line, number - 1)
      tokens, line_numbers, comments, first_line, words = [], [], [], None, 0
      continue
    if first_line is None:
      first_line = number
    if line.startswith("#"):
      comments.append(line)
      continue
    where = f"{name}:{number}"
    token = _conllu_token(line, where, allow_empty=allow_empty_columns)
    if is_syntactic_word(token):
      words += 1
      if check_word is not None:
        check_word(token, where, words)
    tokens.append(token)
    line_numbers.append(number)
  if first_line is not None:
    yield _conllu_sentence(tokens, line_numbers, comments, first_line, number)


def _conllu_sentence(tokens, line_numbers, comments, first_line, last_line
                     ) -> ConlluSentence:
  import conllu
  import conllu.parser

  metadata = conllu.Metadata(
      pair for comment in comments for pair in conllu.parser.parse_comment_line(comment))
  return ConlluSentence(conllu.TokenList(tokens, metadata, default_fields=CONLLU_FIELDS),
                        tuple(line_numbers), tuple(comments), first_line, last_line)


def read_conllu_pos(path: PathLike, *, column: str = "upos"
                    ) -> list[TaggedSentence]:
  """Reads words and POS tags from a CoNLL-U file.

  Args:
    path: the `.conllu` file.
    column: `"upos"` (universal tags, column 4) or `"xpos"` (language-specific
      tags, column 5).

  Returns:
    One `TaggedSentence` per sentence with words, in file order.

  Raises:
    UserError: an unknown column name, or a malformed line (wrong column
      count, an ID that is not an integer, a range or an empty node, an empty
      tag).
  """
  if column not in POS_COLUMNS:
    raise errors.UserError(
        f"read_conllu_pos: unknown column {column!r}; use one of "
        f"{sorted(POS_COLUMNS)}.")
  other = "xpos" if column == "upos" else "upos"

  def check_tag(token, where, position):
    del position  # Word order is not checked: only the tags are read.
    if token[column] in ("", "_"):
      raise errors.UserError(
          f"{where}: no {column.upper()} tag for {token['form']!r}. Tag every "
          f"word, or read the other column (column={other!r}).")

  sentences = []
  for sentence in read_conllu_sentences(path, check_word=check_tag):
    words = [t for t in sentence.tokens if is_syntactic_word(t)]
    if words:  # Ranges and empty nodes alone make no sentence.
      sentences.append(TaggedSentence(tuple(t["form"] for t in words),
                                      tuple(t[column] for t in words)))
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
