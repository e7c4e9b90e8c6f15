"""A registered task or mixture as input of the co-occurrence counter (MLM-GC's table).

The counter (`flax_xalign.data.cooc`) counts sequences and reads seqio task
*objects*; resolving a name into its member tasks, vocabulary and languages
is the registry's job, so it lives here, above `data/`. Used by the `cooc`
asset, `xalign cooc`, the Beam pipeline and `bench/cooc.py`.
Each member task of a mixture is read once, unpacked; mixing rates play no
part.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from flax_xalign.data import cooc
from flax_xalign.data import pipeline
from flax_xalign.data.vocab.fingerprint import model_sha256
from flax_xalign.errors import UserError

from . import registry


def members(task: str, split: str) -> list[Any]:
  """The seqio tasks of a task or mixture name that have `split`; UserError when none has."""
  found = [t for t in pipeline.tasks_of(registry.get_provider(task)) if split in t.splits]
  if not found:
    raise UserError(f"no task of {task!r} has a split {split!r}; count a split it has (--split).")
  return found


def task_batches(task: str, *, split: str, languages: Sequence[str], vocab_size: int,
                 stats: dict[str, Any] | None = None) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
  """`task_sequences` in flat batches, for `PairCounter.add_batch`: (lang index, int32 ids, int64 lengths).

  `stats` (optional) gets 'examples' (read), 'skipped' (non-empty sides in
  other languages) and 'member' (the task being read) added up.
  """
  yield from cooc.batches_of_members(members(task, split), split=split, languages=languages,
                                     vocab_size=vocab_size, stats=stats)


def task_sequences(task: str, *, split: str = "train", languages: Sequence[str],
                   vocab_size: int) -> Iterator[tuple[int, np.ndarray]]:
  """(language index, int32 ids) per side of every example of a task or mixture's split (members once, unpacked).

  Sides in languages not in `languages` are skipped.
  """
  for lang, ids, lengths in task_batches(task, split=split, languages=tuple(languages), vocab_size=vocab_size):
    for sequence in np.split(ids, np.cumsum(lengths)[:-1]):
      yield lang, sequence


def count_task(task: str, *, split: str = "train", languages: Sequence[str] | None = None,
               window: int = cooc.DEFAULT_WINDOW, reference_language: str = cooc.DEFAULT_REFERENCE_LANGUAGE,
               drop_diagonal: bool = False, log: Callable[[str], Any] | None = print) -> cooc.CoocTable:
  """The table of a registered seqio task or mixture's split, in one streaming pass.

  Args:
    task: a task or mixture name (each member task is read once; rates play no part).
    split: the split to count.
    languages: the languages counted (others are skipped); None: the task's.
    window, reference_language, drop_diagonal: see `cooc.finalize`.
    log: progress lines every few seconds and a summary; None: quiet.

  Raises:
    UserError: unknown task, no member with `split`, a bad window, ids outside
      the task's vocabulary, or an empty corpus.
  """
  start = time.perf_counter()
  if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
    raise UserError(f"the window must be an integer >= 1 (n of the ±n window; the paper: 2), got {window!r}.")
  vocab_size = int(registry.get_vocabulary(task).vocab_size)
  languages = tuple(sorted(set(languages))) if languages is not None else tuple(registry.languages_of(task))
  counter = cooc.PairCounter(languages=languages, vocab_size=vocab_size, window=window)
  stats = {"examples": 0, "skipped": 0, "member": task}
  report = cooc.progress_logger(log, f"{task}:{split}")
  seen = 0
  for lang, ids, lengths in task_batches(task, split=split, languages=languages, vocab_size=vocab_size,
                                         stats=stats):
    counter.add_batch(lang, ids, lengths)
    seen += ids.size
    report(seen, stats["examples"])
  counts = counter.result()
  report(int(counts.tokens.sum()), stats["examples"], True)
  if stats["skipped"] and log is not None:
    log(f"cooc: skipped {stats['skipped']:,} sides in languages other than {list(languages)}")
  source = {"task": task, "split": split, "examples": stats["examples"], "skipped_sides": stats["skipped"],
            cooc.VOCABULARY_KEY: model_sha256(registry.get_vocabulary(task))}
  table = cooc.finalize(counts, reference_language=reference_language, drop_diagonal=drop_diagonal, source=source,
                        seconds=time.perf_counter() - start, log=log)
  if log is not None:
    log(cooc.summary(table))
  return table
