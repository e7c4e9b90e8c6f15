"""Language-specific vocabularies (Lu, Lu & Zhang 2023, §2.1): the `lang_vocab` asset.

For two languages l_a, l_b of a run, V_l is the set of regular token ids whose
count in the corpus C_l of language l is larger than `min_count` (the paper:
100); the language-specific vocabularies are V_la \\ V_lb and V_lb \\ V_la
(tokens frequent in both are removed, "to avoid the impact of overlapping").
Special ids (outside `[first_regular, end_regular)`) are never included.

Many languages (the paper's setting: "language-specific vocabularies from
other languages to English", one dictionary per X-En pair, §2.2): with a
`pivot` language P, every other language X makes one pair (X, P) with its
own two vocabularies V_X \\ V_P and V_P \\ V_X, so the pivot has one
vocabulary per partner (its side is labelled `P@X` in files). Without a
pivot, exactly two languages make one pair, as before.

C_l is the `split` (train) of the run's task, or of every member task of a
mixture, read once, unpacked and untrimmed (not the rate-sampled infinite
stream): the `tokens` of an example count for its `lang`, a bitext example's
`tokens_b` for its `lang_b`. `count_tokens` is that pass; its result is cached
in-process (the `induced_dictionary` asset reuses it).

Options (`asset_options={'lang_vocab': {...}}`, gin
`train.asset_options`): `languages` (codes; two without a pivot, side 0
first; default: the run's languages), `pivot` (a code among them; default:
none for two languages, 'en' for more when the run has it), `min_count`
(default 100; kept when count > min_count), `split` ('train').

Value (S = 2 x pairs sides: side 2p is pair p's language X_p, side 2p + 1
its partner, the pivot; fixed capacity C = the largest side):

    ids      int32 [S, C]  sorted language-specific ids of side s; 0 in padding
    mask     bool  [S, C]
    counts   int32 [S, C]  count of each id in its own language (saturates at 2**31 - 1)
    lang_ids int32 [S]     run.language_id of each side's language

The other side of side s is s ^ 1. File `lang_vocab.tsv`: `# key: value`
header lines (languages, pivot and side labels when there is a pivot,
lang_ids, min_count, task, split, token totals, capacity), a column header
line, then `lang<TAB>id<TAB>piece<TAB>count` per id (lang = the side's
label), side 0 first. Pieces are for reading; `load` ignores them.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from flax_xalign import storage
from flax_xalign.assets import registry
from flax_xalign.assets.base import Asset, Value
from flax_xalign.errors import UserError
from flax_xalign.fileio import write_atomically

if TYPE_CHECKING:
  from flax_xalign.run_spec import RunSpec

FILENAME = "lang_vocab.tsv"
DEFAULT_MIN_COUNT = 100
DEFAULT_SPLIT = "train"
OPTIONS = ("languages", "pivot", "min_count", "split")
DEFAULT_PIVOT = "en"
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
  """The padded value of S sorted id lists and their counts."""
  capacity = max(len(s) for s in sides)
  n = len(sides)
  value = {"ids": np.zeros((n, capacity), np.int32), "mask": np.zeros((n, capacity), bool),
           "counts": np.zeros((n, capacity), np.int32), "lang_ids": np.asarray(lang_ids, np.int32).reshape(n)}
  for s, (ids, c) in enumerate(zip(sides, counts)):
    value["ids"][s, :len(ids)] = ids
    value["mask"][s, :len(ids)] = True
    value["counts"][s, :len(ids)] = np.minimum(np.asarray(c, np.int64), _INT32_MAX)
  return value


def pairs_of(languages: Sequence[str], pivot: str | None) -> tuple[tuple[str, str], ...]:
  """The language pairs (X, partner) of a setting: one pair without a pivot, (X, pivot) for each X with one."""
  if pivot is None:
    return ((languages[0], languages[1]),)
  return tuple((code, pivot) for code in languages if code != pivot)


def side_labels(languages: Sequence[str], pivot: str | None) -> tuple[str, ...]:
  """One label per side: the language code, and `P@X` for the pivot's vocabulary against X."""
  if pivot is None:
    return tuple(languages[:2])
  return tuple(label for code, _ in pairs_of(languages, pivot) for label in (code, f"{pivot}@{code}"))


def side_language(label: str) -> str:
  """The language of a side label (`P@X` -> P)."""
  return label.split("@", 1)[0]


# ---------------------------------------------------------------- settings


def settings_of(run: "RunSpec", options: Mapping[str, Any], *, asset: str = "lang_vocab",
                allowed: Sequence[str] = OPTIONS) -> tuple[tuple[str, ...], int, str, str | None]:
  """(languages, min_count, split, pivot) from an asset's options; UserError for bad ones.

  Raises `registry.Unavailable` when no `languages` option is given and the
  run has fewer than two languages, or more than two and neither a `pivot`
  option nor English.
  """
  unknown = sorted(set(options) - set(allowed))
  if unknown:
    raise UserError(f"unknown {asset} option(s) {unknown}; it takes {', '.join(map(repr, allowed))}.")
  languages = options.get("languages")
  pivot = options.get("pivot")
  if languages is None:
    if len(run.languages) < 2:
      raise registry.Unavailable(
          f"a language-specific vocabulary needs two languages, and the run has {len(run.languages)} "
          f"({', '.join(run.languages)}); name them with asset_options={{'{asset}': {{'languages': "
          f"['xx', 'yy']}}}}")
    if len(run.languages) > 2 and pivot is None and DEFAULT_PIVOT not in run.languages:
      raise registry.Unavailable(
          f"the run has {len(run.languages)} languages ({', '.join(run.languages)}) and no English to pair them "
          f"with; name a pivot language, asset_options={{'{asset}': {{'pivot': 'xx'}}}}, or two languages")
    languages = run.languages
  if isinstance(languages, str) or not isinstance(languages, Sequence) or len(languages) < 2 \
      or len(set(languages)) != len(languages):
    raise UserError(f"{asset} option 'languages' must name two or more different languages, e.g. "
                    f"{list(run.languages[:2])}; got {languages!r}.")
  missing = [code for code in languages if code not in run.languages]
  if missing:
    raise UserError(f"{asset} option 'languages': {missing} not among the run's languages "
                    f"{list(run.languages)}; use codes of the task's languages.")
  if pivot is None and len(languages) > 2:
    if DEFAULT_PIVOT not in languages:
      raise UserError(f"{asset}: {len(languages)} languages {list(languages)} need a pivot that every other "
                      f"language is paired with (the paper: English); set asset_options={{'{asset}': "
                      f"{{'pivot': '{languages[0]}'}}}} or name two languages.")
    pivot = DEFAULT_PIVOT
  if pivot is not None and (not isinstance(pivot, str) or pivot not in languages):
    raise UserError(f"{asset} option 'pivot' must be one of its languages {list(languages)}, got {pivot!r}.")
  min_count = options.get("min_count", DEFAULT_MIN_COUNT)
  if isinstance(min_count, bool) or not isinstance(min_count, (int, np.integer)) or min_count < 0:
    raise UserError(f"{asset} option 'min_count' must be an integer >= 0 (a token is kept when its count is "
                    f"larger), got {min_count!r}.")
  split = options.get("split", DEFAULT_SPLIT)
  if not isinstance(split, str) or not split:
    raise UserError(f"{asset} option 'split' must be a split name such as 'train', got {split!r}.")
  return tuple(str(code) for code in languages), int(min_count), split, pivot


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
                   split: str | None = None, pivot: str | None = None,
                   log: Callable[[str], Any] | None = print) -> Value:
  """The `lang_vocab` value of a run (arguments left None come from its asset options, then the defaults).

  `languages` given without `pivot` means no pivot (two languages, side 0 =
  languages[0]), whatever the run's options say.

  Raises:
    UserError: bad options, or an empty side (lower `min_count`).
  """
  options = run.options_of("lang_vocab")
  if languages is not None:
    options["languages"] = list(languages)
    options.pop("pivot", None)
  for key, given in (("min_count", min_count), ("split", split), ("pivot", pivot)):
    if given is not None:
      options[key] = given
  try:
    languages, min_count, split, pivot = settings_of(run, options)
  except registry.Unavailable as e:
    raise UserError(str(e)) from None
  ensure_registered(run)
  pairs = pairs_of(languages, pivot)
  # Every language of the run in one pass (the cache then serves each of its pairs without a re-read).
  counted = list(dict.fromkeys([*run.languages, *(code for pair in pairs for code in pair)]))
  counts = cached_counts(run.task, languages=counted, vocab_size=run.vocabulary.size, split=split, log=log)
  specials = run.vocabulary.specials
  sides, side_counts = [], []
  for pair in pairs:
    rows = [counted.index(code) for code in pair]
    found = language_specific(counts[rows], min_count=min_count, first_regular=specials.first_regular,
                              end_regular=specials.end_regular)
    for s, ids in enumerate(found):
      if not len(ids):
        raise UserError(
            f"the language-specific vocabulary of {pair[s]!r} is empty (paired with {pair[1 - s]!r}): no regular token "
            f"occurs more than min_count={min_count} times in its {split} data of {run.task!r} "
            f"({int(counts[rows[s]].sum()):,} tokens) without also doing so in {pair[1 - s]!r}. Lower min_count "
            f"(e.g. asset_options={{'lang_vocab': {{'min_count': {max(min_count // 10, 1)}}}}}).")
      sides.append(ids)
      side_counts.append(counts[rows[s], ids])
  return pack(sides, side_counts, [run.language_id(code) for pair in pairs for code in pair])


# ---------------------------------------------------------------- files


def piece_function(run: "RunSpec") -> Callable[[int], str] | None:
  """id -> readable piece of the run's vocabulary (ids of a doubled vocabulary map to their base piece).

  None when the run's task is not registered here; the tokenizer is read on first use.
  """
  try:
    from flax_xalign import tasks  # The task registry needs seqio: a host without it registers no task.
  except ImportError:
    return None
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
                    "cut). Rebuild it with `xalign assets` or remove it.")
  return header[key]


def sides_of_header(path: str, header: Mapping[str, str]) -> list[str]:
  """The side labels a file's header records (`sides`, else the two `languages`)."""
  sides = header.get("sides", "").split() or header_value(path, header, "languages").split()
  if len(sides) < 2 or len(sides) % 2:
    raise UserError(f"{path}: the header must name an even number (>= 2) of sides; the file was cut or edited.")
  return sides


def setting_lines(languages: Sequence[str], pivot: str | None) -> list[str]:
  """The header lines that name a file's languages and sides."""
  lines = [f"# languages: {' '.join(languages)}"]
  if pivot is not None:
    lines += [f"# pivot: {pivot}", f"# sides: {' '.join(side_labels(languages, pivot))}"]
  return lines


def check_sides(filename: str, header: Mapping[str, str], sides: Sequence[str]) -> None:
  """UserError when a loaded file's sides are other languages than this run's (labels aside)."""
  recorded = header.get("sides", "").split() or header.get("languages", "").split()
  if recorded and [side_language(x) for x in recorded] != [side_language(x) for x in sides]:
    raise UserError(f"{filename} was built with sides {' '.join(recorded)!r} (this run: {' '.join(sides)!r}); "
                    "remove it (it is rebuilt with this run's languages and pivot) or use a new MODEL_DIR.")


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
    with storage.open_file(path, encoding="utf-8") as f:
      return f.read().splitlines()
  except (OSError, UnicodeDecodeError) as e:
    raise UserError(f"cannot read {path} ({e}).") from e


class LangVocab(Asset):
  """`lang_vocab`: the language-specific vocabularies of one or more pairs (see the module docstring)."""

  name = "lang_vocab"
  files = (FILENAME,)

  def __init__(self, *, languages: Sequence[str], min_count: int, split: str, task: str = "",
               vocab_size: int = 0, piece: Callable[[int], str] | None = None, pivot: str | None = None):
    self.languages = tuple(languages)
    self.pivot = pivot
    self.min_count = int(min_count)
    self.split = split
    self.task = task
    self.vocab_size = int(vocab_size)
    self._piece = piece
    # The header of the file `load` read last: `check` compares it with the run's settings.
    self.loaded_header: dict[str, str] | None = None

  @property
  def sides(self) -> tuple[str, ...]:
    """One label per side (the language; `P@X` for the pivot's vocabulary against X)."""
    return side_labels(self.languages, self.pivot)

  def build(self, run: "RunSpec") -> Value:
    return lang_vocab_for(run, languages=self.languages, min_count=self.min_count, split=self.split,
                          pivot=self.pivot)

  def save(self, directory: str, value: Value) -> None:
    mask = np.asarray(value["mask"], bool)
    sides = range(mask.shape[0])
    totals = [int(np.asarray(value["counts"], np.int64)[s][mask[s]].sum()) for s in sides]
    lines = [
        "# language-specific vocabularies (Lu, Lu & Zhang 2023, §2.1), flax_xalign lang_vocab asset",
        *setting_lines(self.languages, self.pivot),
        f"# lang_ids: {' '.join(str(int(i)) for i in np.asarray(value['lang_ids']))}",
        f"# min_count: {self.min_count}",
        f"# task: {self.task}",
        f"# split: {self.split}",
        f"# vocab_size: {self.vocab_size}",
        f"# sizes: {' '.join(str(int(mask[s].sum())) for s in sides)}",
        f"# capacity: {mask.shape[1]}",
        f"# kept_token_totals: {' '.join(map(str, totals))}",
        "\t".join(COLUMNS),
    ]
    for s, label in enumerate(self.sides):
      for i, n in zip(np.asarray(value["ids"])[s][mask[s]], np.asarray(value["counts"])[s][mask[s]]):
        piece = clean_piece(self._piece(int(i))) if self._piece is not None else ""
        lines.append(f"{label}\t{int(i)}\t{piece}\t{int(n)}")
    write_atomically(os.path.join(directory, FILENAME), "\n".join(lines) + "\n")

  def load(self, directory: str) -> Value:
    path = os.path.join(directory, FILENAME)
    lines = read_lines(path)
    header, start = parse_header(path, lines)
    sides_seen = sides_of_header(path, header)
    try:
      lang_ids = [int(x) for x in header_value(path, header, "lang_ids").split()]
      capacity = int(header_value(path, header, "capacity"))
    except ValueError as e:
      raise UserError(f"{path}: malformed header ({e}).") from e
    if len(lang_ids) != len(sides_seen):
      raise UserError(f"{path}: the header names {len(sides_seen)} sides and {len(lang_ids)} lang_ids.")
    if start >= len(lines) or lines[start].split("\t") != list(COLUMNS):
      raise UserError(f"{path}:{start + 1}: expected the column line {chr(9).join(COLUMNS)!r}.")
    sides: list[list[int]] = [[] for _ in sides_seen]
    counts: list[list[int]] = [[] for _ in sides_seen]
    for number, line in enumerate(lines[start + 1:], start=start + 2):
      if not line.strip():
        continue
      fields = line.split("\t")
      try:
        if len(fields) != 4:
          raise ValueError(f"{len(fields)} columns instead of 4")
        side = sides_seen.index(fields[0]) if fields[0] in sides_seen else None
        if side is None:
          raise ValueError(f"language {fields[0]!r} is not one of the header's {sides_seen}")
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
      raise UserError(f"{path}: {', '.join(str(len(s)) for s in sides)} rows per side, but the header says "
                      f"capacity {capacity} and every side must be non-empty; the file was cut or edited.")
    self.loaded_header = dict(header)
    return pack([np.asarray(s, np.int64) for s in sides], [np.asarray(c) for c in counts], lang_ids)

  def check(self, value: Value, run: "RunSpec") -> None:
    header = self.loaded_header or {}
    check_header_settings(FILENAME, header, {
        "min_count": str(self.min_count), "split": self.split, "vocab_size": str(run.vocabulary.size)},
        options="lang_vocab options")
    check_sides(FILENAME, header, self.sides)
    expected_ids = [run.language_id(side_language(label)) for label in self.sides]
    found = [int(x) for x in np.asarray(value["lang_ids"])]
    if found != expected_ids:
      raise UserError(f"{FILENAME} is for languages with ids {found}, but this run's {list(self.sides)} have "
                      f"{expected_ids}; remove it (it is rebuilt) or use a new MODEL_DIR.")
    ids = np.asarray(value["ids"])[np.asarray(value["mask"], bool)]
    low, high = run.vocabulary.specials.regular_range(run.vocabulary.size)
    if ids.size and (ids.min() < low or ids.max() >= high):
      raise UserError(f"{FILENAME} holds ids outside this run's regular ids [{low}, {high}); it was built for "
                      "another vocabulary: remove it (it is rebuilt) or use a new MODEL_DIR.")

  def describe(self, value: Value) -> str:
    mask = np.asarray(value["mask"], bool)
    sizes = ", ".join(f"{label} {int(mask[s].sum()):,}" for s, label in enumerate(self.sides))
    return f"lang_vocab: language-specific tokens {sizes} (count > {self.min_count}, {self.split})"


@registry.register("lang_vocab")
def _lang_vocab(run: "RunSpec") -> Asset:
  languages, min_count, split, pivot = settings_of(run, run.options_of("lang_vocab"))
  return LangVocab(languages=languages, min_count=min_count, split=split, task=run.task,
                   vocab_size=run.vocabulary.size, piece=piece_function(run), pivot=pivot)
