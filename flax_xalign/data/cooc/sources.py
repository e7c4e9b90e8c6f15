"""Token sequences for the co-occurrence counter: seqio task objects, text files, progress lines.

Everything here takes what to read as an object (a seqio task, file paths, a
vocabulary): resolving a task or mixture *by name* is the task registry's job
(`flax_xalign.tasks.cooc_input`), so `data/` never imports `tasks`.
`member_batches` keeps sequence boundaries: each side of each example (for
bitext `tokens_b` in `lang_b` too) is one sequence, as the package docstring
defines.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from flax_xalign.errors import UserError

_PROGRESS_SECONDS = 5.0
_BATCH = 1024  # Examples per host transfer when streaming a seqio task.


def member_batches(task: Any, *, split: str, languages: Sequence[str],
                   vocab_size: int) -> Iterator[dict[str, np.ndarray]]:
  """One task's split as ragged batches of sides: flat ids, lengths and the language index of each side.

  The pattern of `assets.lang_vocab._member_sides`, keeping sequence boundaries.
  """
  import tensorflow as tf

  ds = task.get_dataset(None, split=split, shuffle=False, num_epochs=1, trim_output_features=False)
  spec = ds.element_spec
  if "tokens" not in spec:
    raise UserError(f"task {task.name!r} has no 'tokens' feature (it has {sorted(spec)}); the co-occurrence "
                    "counter counts the token ids of 'tokens' (and 'tokens_b').")
  if "lang" not in spec and len(languages) != 1:
    raise UserError(f"task {task.name!r} has no 'lang' feature, so its tokens cannot be counted for one of "
                    f"{list(languages)}; count it alone with one language (--languages=xx) or add 'lang'.")
  known = tf.constant(list(languages))
  index_of = tf.range(len(languages), dtype=tf.int32)

  def index(lang):  # -1: a language not counted.
    return tf.reduce_sum(tf.where(tf.equal(known, lang), index_of + 1, 0)) - 1

  def sides(ex):
    out = {"ids": tf.cast(tf.reshape(ex["tokens"], [-1]), tf.int32),
           "lang": index(ex["lang"]) if "lang" in ex else tf.constant(0, tf.int32)}
    if "tokens_b" in ex and "lang_b" in ex and ex["tokens_b"].shape.as_list() != [0]:  # Text tasks: [0].
      out["ids_b"] = tf.cast(tf.reshape(ex["tokens_b"], [-1]), tf.int32)
      out["lang_b"] = index(ex["lang_b"])
    return out

  ds = ds.map(sides, num_parallel_calls=tf.data.AUTOTUNE).ragged_batch(_BATCH)

  def flat(batch):
    out = {}
    for side in ("", "_b"):
      if f"ids{side}" in batch:
        out[f"ids{side}"] = batch[f"ids{side}"].flat_values
        out[f"lengths{side}"] = batch[f"ids{side}"].row_lengths()
        out[f"lang{side}"] = batch[f"lang{side}"]
    return out

  options = tf.data.Options()
  options.deterministic = True
  yield from ds.map(flat).with_options(options).as_numpy_iterator()


def split_by_language(ids: np.ndarray, lengths: np.ndarray,
                      langs: np.ndarray) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
  """(lang, ids, lengths) of the sequences of each counted language in a flat batch (-1: skipped)."""
  for lang in np.unique(langs):
    if lang < 0:
      continue
    rows = langs == lang
    if rows.all():
      yield int(lang), ids, lengths
    else:
      yield int(lang), ids[np.repeat(rows, lengths)], lengths[rows]


def batches_of_members(members: Iterable[Any], *, split: str, languages: Sequence[str], vocab_size: int,
                       stats: dict[str, Any] | None = None) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
  """The sides of seqio tasks' split in flat batches: (lang index, int32 ids, int64 lengths).

  Each member is read once, unpacked, in order; the batches feed
  `PairCounter.add_batch`.

  `stats` (optional) gets 'examples' (read), 'skipped' (non-empty sides in
  other languages) and 'member' (the task being read) added up.
  """
  stats = {} if stats is None else stats
  stats.setdefault("examples", 0)
  stats.setdefault("skipped", 0)
  for member in members:
    stats["member"] = member.name
    for batch in member_batches(member, split=split, languages=languages, vocab_size=vocab_size):
      stats["examples"] += len(batch["lang"])
      for side in ("", "_b"):
        if f"ids{side}" not in batch:
          continue
        ids, lengths, langs = batch[f"ids{side}"], batch[f"lengths{side}"], batch[f"lang{side}"]
        stats["skipped"] += int(((langs < 0) & (lengths > 0)).sum())
        if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
          raise UserError(f"task {member.name!r} ({split}) yields token ids outside [0, {vocab_size}); its "
                          "vocabulary is not the one counted with.")
        yield from split_by_language(ids, lengths, langs)


def encoder_of(vocabulary: Any) -> tuple[Callable[[str], Sequence[int]], int]:
  """(text -> ids, vocabulary size) of a seqio vocabulary, an object with `encode`, or a SentencePiece file."""
  if isinstance(vocabulary, (str, os.PathLike)):
    import sentencepiece as spm

    path = os.fspath(vocabulary)
    if not os.path.isfile(path):
      raise UserError(f"--vocabulary {path} does not exist; pass a SentencePiece .model file.")
    try:
      processor = spm.SentencePieceProcessor(model_file=path)
    except (OSError, RuntimeError) as e:
      raise UserError(f"--vocabulary {path} is not a SentencePiece model ({e}).") from e
    return processor.encode, int(processor.get_piece_size())
  return vocabulary.encode, int(vocabulary.vocab_size)


def text_sequences(paths: Sequence[str], *, vocabulary: Any, language: int = 0) -> Iterator[tuple[int, np.ndarray]]:
  """(language, int32 ids) per non-blank line of UTF-8 text files (one sentence per line).

  Args:
    paths: the files.
    vocabulary: a seqio vocabulary (or anything with `encode(text)` and
      `vocab_size`) or the path of a SentencePiece model.
    language: the language index the sequences get.
  """
  from flax_xalign.fileio import utf8_lines

  encode, _ = encoder_of(vocabulary)
  for path in ([paths] if isinstance(paths, str) else paths):
    if not os.path.isfile(path):
      raise UserError(f"text file {path} does not exist; pass UTF-8 files with one sentence per line.")
    for _, line in utf8_lines(path, what=path):
      if line.strip():
        yield language, np.asarray(encode(line.strip()), np.int32)


def progress_logger(log: Callable[[str], Any] | None, what: str) -> Callable[[int, int, bool], None]:
  """A callback(tokens, examples, last) that logs a line every few seconds (and the last one)."""
  start = time.perf_counter()
  last = [start]

  def report(tokens: int, examples: int, final: bool = False) -> None:
    now = time.perf_counter()
    if log is not None and (final or now - last[0] >= _PROGRESS_SECONDS):
      last[0] = now
      log(f"cooc: counting {what}: {examples:,} examples, {tokens:,} tokens, "
          f"{tokens / max(now - start, 1e-9):,.0f} tokens/s")

  return report
