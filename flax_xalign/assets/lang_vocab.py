"""Language-specific vocabularies (Lu, Lu & Zhang 2023, §2.1): the `lang_vocab` asset.

For two languages l_a, l_b of a run, V_l is the set of regular token ids whose
count in the corpus C_l of language l is larger than `min_count` (the paper:
100); the language-specific vocabularies are V_la \\ V_lb and V_lb \\ V_la
(tokens frequent in both are removed, "to avoid the impact of overlapping").
Special ids (outside `[first_regular, end_regular)`) are never included.

C_l is the `split` (train) of the run's task, or of every member task of a
mixture, read once, unpacked and untrimmed (not the rate-sampled infinite
stream): the `tokens` of an example count for its `lang`, a bitext example's
`tokens_b` for its `lang_b`. `count_tokens` is that pass; its result is cached
in-process (the `induced_dictionary` asset reuses it).

Options (`asset_options={'lang_vocab': {...}}`, gin
`train.asset_options`): `languages` (two codes, side 0 first; default: the
run's languages when it has exactly two), `min_count` (default 100; kept
when count > min_count), `split` ('train').

Value (fixed capacity C = the larger side):

    ids      int32 [2, C]  sorted language-specific ids of side s; 0 in padding
    mask     bool  [2, C]
    counts   int32 [2, C]  count of each id in its own language (saturates at 2**31 - 1)
    lang_ids int32 [2]     run.language_id of each side

File `lang_vocab.tsv`: `# key: value` header lines (languages, lang_ids,
min_count, task, split, token totals, capacity), a column header line, then
`lang<TAB>id<TAB>piece<TAB>count` per id, side 0 first. Pieces are for
reading; `load` ignores them.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from flax_xalign.assets import registry
from flax_xalign.assets.base import Asset, Value
from flax_xalign.errors import UserError
from flax_xalign.fileio import write_atomically

if TYPE_CHECKING:
  from flax_xalign.run_spec import RunSpec

FILENAME = "lang_vocab.tsv"
DEFAULT_MIN_COUNT = 100
DEFAULT_SPLIT = "train"
OPTIONS = ("languages", "min_count", "split")
COLUMNS = ("lang", "id", "piece", "count")
_INT32_MAX = np.iinfo(np.int32).max
_PROGRESS_SECONDS = 5.0

# (task, split, languages, vocab_size, max_examples) -> counts; see `cached_counts`.
_COUNTS: dict[tuple[Any, ...], np.ndarray] = {}


# ---------------------------------------------------------------- counting


def count_tokens(task: str, *, languages: Sequence[str], vocab_size: int, split: str = DEFAULT_SPLIT,
                 max_examples: int | None = None, log: Callable[[str], Any] | None = print) -> np.ndarray:
  """Per-language token-id counts of a task or mixture, in one streaming pass.

  Args:
    task: a registered task or mixture (every member task is read once, in
      the mixture's listed order; rates play no part).
    languages: the languages to count; examples in other languages are skipped.
    vocab_size: the number of ids (the model's embedding rows).
    split: the split to read.
    max_examples: read at most this many examples of each member task.
    log: progress lines (every few seconds, and one at the end); None: quiet.

  Returns:
    int64 [len(languages), vocab_size]: counts[l, i] = occurrences of id i in
    the examples (sides) of language languages[l].

  Raises:
    UserError: unknown task, no member task has `split`, a task without
      `lang`, or ids outside [0, vocab_size).
  """
  from flax_xalign import tasks
  from flax_xalign.data import pipeline, task_reads

  languages = tuple(languages)
  members = [t for t in pipeline.tasks_of(tasks.get_provider(task)) if split in t.splits]
  if not members:
    raise UserError(f"no task of {task!r} has a split {split!r}; set the lang_vocab option 'split' to one it has.")
  counts = np.zeros(len(languages) * vocab_size, np.int64)
  start = last = time.perf_counter()
  examples = tokens = 0
  for member in members:
    for batch in task_reads.language_key_batches(member, languages, vocab_size, split, max_examples):
      if batch["bad"]:
        raise UserError(f"task {member.name!r} ({split}) yields token ids outside [0, {vocab_size}); its vocabulary "
                        "is not the run's.")
      keys = batch["keys"]
      counts += np.bincount(keys[keys >= 0], minlength=counts.size)
      examples += int(batch["examples"])
      tokens += int(batch["tokens"])
      now = time.perf_counter()
      if log is not None and now - last >= _PROGRESS_SECONDS:
        last = now
        log(f"lang_vocab: counting {task}:{split} ({member.name}): {examples:,} examples, {tokens:,} tokens, "
            f"{tokens / (now - start):,.0f} tokens/s")
  counts = counts.reshape(len(languages), vocab_size)
  if log is not None:
    totals = ", ".join(f"{code} {int(n):,}" for code, n in zip(languages, counts.sum(axis=1)))
    log(f"lang_vocab: counted {task}:{split} in {time.perf_counter() - start:.1f} s: {examples:,} examples; "
        f"tokens {totals}")
  return counts


def cached_counts(task: str, *, languages: Sequence[str], vocab_size: int, split: str = DEFAULT_SPLIT,
                  max_examples: int | None = None, log: Callable[[str], Any] | None = print) -> np.ndarray:
  """`count_tokens`, remembered for the process (keyed by task, split, languages, size); do not modify."""
  key = (task, split, tuple(languages), int(vocab_size), max_examples)
  if key not in _COUNTS:
    counts = count_tokens(task, languages=languages, vocab_size=vocab_size, split=split,
                          max_examples=max_examples, log=log)
    counts.setflags(write=False)
    _COUNTS[key] = counts
  return _COUNTS[key]


# ---------------------------------------------------------------- §2.1


def language_specific(counts: np.ndarray, *, min_count: int, first_regular: int,
                      end_regular: int | None) -> tuple[np.ndarray, np.ndarray]:
  """The language-specific vocabularies of two languages (§2.1).

  Args:
    counts: [2, vocab] token counts of the two languages' corpora.
    min_count: a token belongs to V_l when its count in C_l is > min_count.
    first_regular: the smallest regular id (smaller ids are special).
    end_regular: one past the largest regular id (None: the vocabulary size).

  Returns:
    (sorted int64 ids of V_0 \\ V_1, sorted int64 ids of V_1 \\ V_0).
  """
  counts = np.asarray(counts)
  if counts.ndim != 2 or counts.shape[0] != 2:
    raise ValueError(f"counts must be [2, vocab], got shape {counts.shape}")
  size = counts.shape[1]
  regular = np.zeros(size, bool)
  regular[first_regular:size if end_regular is None else min(end_regular, size)] = True
  frequent = (counts > min_count) & regular
  shared = frequent[0] & frequent[1]
  return np.flatnonzero(frequent[0] & ~shared), np.flatnonzero(frequent[1] & ~shared)


def pack(sides: Sequence[np.ndarray], counts: Sequence[np.ndarray], lang_ids: Sequence[int]) -> Value:
  """The padded value of two sorted id lists and their counts."""
  capacity = max(len(s) for s in sides)
  value = {"ids": np.zeros((2, capacity), np.int32), "mask": np.zeros((2, capacity), bool),
           "counts": np.zeros((2, capacity), np.int32), "lang_ids": np.asarray(lang_ids, np.int32).reshape(2)}
  for s, (ids, n) in enumerate(zip(sides, counts)):
    value["ids"][s, :len(ids)] = ids
    value["mask"][s, :len(ids)] = True
    value["counts"][s, :len(ids)] = np.minimum(np.asarray(n, np.int64), _INT32_MAX)
  return value


# ---------------------------------------------------------------- settings


def settings_of(run: "RunSpec", options: Mapping[str, Any], *, asset: str = "lang_vocab",
                allowed: Sequence[str] = OPTIONS) -> tuple[tuple[str, str], int, str]:
  """(languages, min_count, split) from an asset's options; UserError for bad ones.

  Raises `registry.Unavailable` when no `languages` option is given and the
  run does not have exactly two languages.
  """
  unknown = sorted(set(options) - set(allowed))
  if unknown:
    raise UserError(f"unknown {asset} option(s) {unknown}; it takes {', '.join(map(repr, allowed))}.")
  languages = options.get("languages")
  if languages is None:
    if len(run.languages) != 2:
      raise registry.Unavailable(
          f"a language-specific vocabulary needs two languages, and the run has {len(run.languages)} "
          f"({', '.join(run.languages)}); name them with asset_options={{'{asset}': {{'languages': "
          f"['xx', 'yy']}}}}")
    languages = run.languages
  if isinstance(languages, str) or not isinstance(languages, Sequence) or len(languages) != 2 \
      or languages[0] == languages[1]:
    raise UserError(f"{asset} option 'languages' must name two different languages, e.g. "
                    f"{list(run.languages[:2])}; got {languages!r}.")
  missing = [code for code in languages if code not in run.languages]
  if missing:
    raise UserError(f"{asset} option 'languages': {missing} not among the run's languages "
                    f"{list(run.languages)}; use codes of the task's languages.")
  min_count = options.get("min_count", DEFAULT_MIN_COUNT)
  if isinstance(min_count, bool) or not isinstance(min_count, (int, np.integer)) or min_count < 0:
    raise UserError(f"{asset} option 'min_count' must be an integer >= 0 (a token is kept when its count is "
                    f"larger), got {min_count!r}.")
  split = options.get("split", DEFAULT_SPLIT)
  if not isinstance(split, str) or not split:
    raise UserError(f"{asset} option 'split' must be a split name such as 'train', got {split!r}.")
  return (str(languages[0]), str(languages[1])), int(min_count), split


def ensure_registered(run: "RunSpec") -> None:
  """Registers the run's user-defined tasks when another process (an evaluation) reads the asset."""
  from flax_xalign import tasks

  try:
    tasks.get_provider(run.task)
  except UserError:
    if not run.task_definitions:
      raise
    tasks.registry.register_described(run.task_definitions)


def lang_vocab_for(run: "RunSpec", *, languages: Sequence[str] | None = None, min_count: int | None = None,
                   split: str | None = None, log: Callable[[str], Any] | None = print) -> Value:
  """The `lang_vocab` value of a run (arguments left None come from its asset options, then the defaults).

  Raises:
    UserError: bad options, or an empty side (lower `min_count`).
  """
  options = run.options_of("lang_vocab")
  for key, given in (("languages", languages), ("min_count", min_count), ("split", split)):
    if given is not None:
      options[key] = list(given) if key == "languages" else given
  try:
    languages, min_count, split = settings_of(run, options)
  except registry.Unavailable as e:
    raise UserError(str(e)) from None
  ensure_registered(run)
  vocab_size = run.vocabulary.size
  counts = cached_counts(run.task, languages=languages, vocab_size=vocab_size, split=split, log=log)
  specials = run.vocabulary.specials
  sides = language_specific(counts, min_count=min_count, first_regular=specials.first_regular,
                            end_regular=specials.end_regular)
  for s, ids in enumerate(sides):
    if not len(ids):
      other = languages[1 - s]
      raise UserError(
          f"the language-specific vocabulary of {languages[s]!r} is empty: no regular token occurs more than "
          f"min_count={min_count} times in its {split} data of {run.task!r} ({int(counts[s].sum()):,} tokens) "
          f"without also doing so in {other!r}. Lower min_count (e.g. asset_options={{'lang_vocab': "
          f"{{'min_count': {max(min_count // 10, 1)}}}}}).")
  return pack(sides, [counts[s, ids] for s, ids in enumerate(sides)],
              [run.language_id(code) for code in languages])


# ---------------------------------------------------------------- files


def piece_function(run: "RunSpec") -> Callable[[int], str] | None:
  """id -> readable piece of the run's vocabulary (ids of a doubled vocabulary map to their base piece).

  None when the run's task is not registered here; the tokenizer is read on first use.
  """
  from flax_xalign import tasks

  try:
    vocabulary = tasks.get_vocabulary(run.task)
  except UserError:
    return None
  if isinstance(getattr(vocabulary, "tokens", None), tuple):  # WordPiece: the vocab.txt lines.
    return lambda i: vocabulary.tokens[int(i)]
  base = getattr(vocabulary, "base", vocabulary)
  if not hasattr(base, "tokenizer"):
    return None
  pieces = run.vocabulary.pieces
  return lambda i: base.tokenizer.id_to_piece(int(i) % pieces)


def clean_piece(piece: str) -> str:
  """A piece as one TSV field (tabs and line breaks escaped)."""
  return piece.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def parse_header(path: str, lines: Sequence[str]) -> tuple[dict[str, str], int]:
  """`# key: value` lines at the top of a file -> ({key: value}, index of the first other line)."""
  header: dict[str, str] = {}
  index = 0
  while index < len(lines) and lines[index].startswith("#"):
    key, sep, value = lines[index][1:].partition(":")
    if sep:
      header[key.strip()] = value.strip()
    index += 1
  return header, index


def header_value(path: str, header: Mapping[str, str], key: str) -> str:
  if key not in header:
    raise UserError(f"{path}: the header has no '# {key}: ...' line; it was not written by flax_xalign (or was "
                    "cut). Rebuild it with `python -m flax_xalign.assets` or remove it.")
  return header[key]


def check_header_settings(filename: str, header: Mapping[str, str], settings: Mapping[str, str], *,
                          options: str) -> None:
  """UserError naming every setting a loaded file's header records differently from this run's."""
  differ = [f"{key} {header[key]!r} (this run: {want!r})" for key, want in settings.items()
            if key in header and header[key] != want]
  if differ:
    raise UserError(f"{filename} was built with {', '.join(differ)}; remove it (it is rebuilt with this run's "
                    f"{options}) or use a new MODEL_DIR.")


def read_lines(path: str) -> list[str]:
  try:
    with open(path, encoding="utf-8") as f:
      return f.read().splitlines()
  except (OSError, UnicodeDecodeError) as e:
    raise UserError(f"cannot read {path} ({e}).") from e


class LangVocab(Asset):
  """`lang_vocab`: the two language-specific vocabularies (see the module docstring)."""

  name = "lang_vocab"
  files = (FILENAME,)

  def __init__(self, *, languages: tuple[str, str], min_count: int, split: str, task: str = "",
               vocab_size: int = 0, piece: Callable[[int], str] | None = None):
    self.languages = tuple(languages)
    self.min_count = int(min_count)
    self.split = split
    self.task = task
    self.vocab_size = int(vocab_size)
    self._piece = piece
    # The header of the file `load` read last: `check` compares it with the run's settings.
    self.loaded_header: dict[str, str] | None = None

  def build(self, run: "RunSpec") -> Value:
    return lang_vocab_for(run, languages=self.languages, min_count=self.min_count, split=self.split)

  def save(self, directory: str, value: Value) -> None:
    mask = np.asarray(value["mask"], bool)
    totals = [int(np.asarray(value["counts"], np.int64)[s][mask[s]].sum()) for s in range(2)]
    lines = [
        "# language-specific vocabularies (Lu, Lu & Zhang 2023, §2.1), flax_xalign lang_vocab asset",
        f"# languages: {self.languages[0]} {self.languages[1]}",
        f"# lang_ids: {int(value['lang_ids'][0])} {int(value['lang_ids'][1])}",
        f"# min_count: {self.min_count}",
        f"# task: {self.task}",
        f"# split: {self.split}",
        f"# vocab_size: {self.vocab_size}",
        f"# sizes: {int(mask[0].sum())} {int(mask[1].sum())}",
        f"# capacity: {mask.shape[1]}",
        f"# kept_token_totals: {totals[0]} {totals[1]}",
        "\t".join(COLUMNS),
    ]
    for s, code in enumerate(self.languages):
      for i, n in zip(np.asarray(value["ids"])[s][mask[s]], np.asarray(value["counts"])[s][mask[s]]):
        piece = clean_piece(self._piece(int(i))) if self._piece is not None else ""
        lines.append(f"{code}\t{int(i)}\t{piece}\t{int(n)}")
    write_atomically(os.path.join(directory, FILENAME), "\n".join(lines) + "\n")

  def load(self, directory: str) -> Value:
    path = os.path.join(directory, FILENAME)
    lines = read_lines(path)
    header, start = parse_header(path, lines)
    languages = header_value(path, header, "languages").split()
    try:
      lang_ids = [int(x) for x in header_value(path, header, "lang_ids").split()]
      capacity = int(header_value(path, header, "capacity"))
    except ValueError as e:
      raise UserError(f"{path}: malformed header ({e}).") from e
    if len(languages) != 2 or len(lang_ids) != 2:
      raise UserError(f"{path}: the header must name two languages and two lang_ids.")
    if start >= len(lines) or lines[start].split("\t") != list(COLUMNS):
      raise UserError(f"{path}:{start + 1}: expected the column line {chr(9).join(COLUMNS)!r}.")
    sides: list[list[int]] = [[], []]
    counts: list[list[int]] = [[], []]
    for number, line in enumerate(lines[start + 1:], start=start + 2):
      if not line.strip():
        continue
      fields = line.split("\t")
      try:
        if len(fields) != 4:
          raise ValueError(f"{len(fields)} columns instead of 4")
        side = languages.index(fields[0]) if fields[0] in languages else None
        if side is None:
          raise ValueError(f"language {fields[0]!r} is not one of the header's {languages}")
        ident, count = int(fields[1]), int(fields[3])
        if ident < 0 or count < 0:
          raise ValueError("negative id or count")
        if sides[side] and ident <= sides[side][-1]:
          raise ValueError("ids of a language must be listed in increasing order")
      except ValueError as e:
        raise UserError(f"{path}:{number}: malformed row {line!r} ({e}); expected "
                        "lang<TAB>id<TAB>piece<TAB>count.") from None
      sides[side].append(ident)
      counts[side].append(count)
    if max(len(s) for s in sides) != capacity or not all(sides):
      raise UserError(f"{path}: {len(sides[0])} and {len(sides[1])} rows, but the header says capacity "
                      f"{capacity} and both sides must be non-empty; the file was cut or edited.")
    self.loaded_header = dict(header)
    return pack([np.asarray(s, np.int64) for s in sides], [np.asarray(c) for c in counts], lang_ids)

  def check(self, value: Value, run: "RunSpec") -> None:
    header = self.loaded_header or {}
    check_header_settings(FILENAME, header, {
        "languages": " ".join(self.languages), "min_count": str(self.min_count), "split": self.split,
        "vocab_size": str(run.vocabulary.size)}, options="lang_vocab options")
    expected_ids = [run.language_id(code) for code in self.languages]
    found = [int(x) for x in np.asarray(value["lang_ids"])]
    if found != expected_ids:
      raise UserError(f"{FILENAME} is for languages with ids {found}, but this run's {list(self.languages)} have "
                      f"{expected_ids}; remove it (it is rebuilt) or use a new MODEL_DIR.")
    ids = np.asarray(value["ids"])[np.asarray(value["mask"], bool)]
    low, high = run.vocabulary.specials.regular_range(run.vocabulary.size)
    if ids.size and (ids.min() < low or ids.max() >= high):
      raise UserError(f"{FILENAME} holds ids outside this run's regular ids [{low}, {high}); it was built for "
                      "another vocabulary: remove it (it is rebuilt) or use a new MODEL_DIR.")

  def describe(self, value: Value) -> str:
    mask = np.asarray(value["mask"], bool)
    sizes = ", ".join(f"{code} {int(mask[s].sum()):,}" for s, code in enumerate(self.languages))
    return f"lang_vocab: language-specific tokens {sizes} (count > {self.min_count}, {self.split})"


@registry.register("lang_vocab")
def _lang_vocab(run: "RunSpec") -> Asset:
  languages, min_count, split = settings_of(run, run.options_of("lang_vocab"))
  return LangVocab(languages=languages, min_count=min_count, split=split, task=run.task,
                   vocab_size=run.vocabulary.size, piece=piece_function(run))
