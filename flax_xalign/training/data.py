"""Where `train.data` is read: the one choice between a seqio task and a packed cache.

    source = resolve_task("tiny_mix")                              # SeqioSource
    source = resolve_task("tiny_mix", data="cache:/data/tiny")     # CacheSource, no seqio imported
    batches = source.batches(feature_lengths={"tokens": 19}, batch_size=6, seed=0)

`resolve_task` parses the setting and builds the `DataSource` of that backend
(training/data_source.py); every caller after it (pretrain, the loop and its
checkpoints, the MLM evaluator, `runs.Run.task_data`) calls the source's
methods and never asks which backend it is.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from flax_xalign.data.packed import format as packed_format
from flax_xalign.training.cache_source import CacheSource
from flax_xalign.training.data_source import DataSource
from flax_xalign.training.seqio_source import SeqioSource


def resolve_task(name: str, *, languages: Sequence[str] | None = None, data: str = "seqio",
                 register_tasks: Callable[[], Any] | None = None, verify: str = "auto",
                 vocabulary_files: Sequence[str] = ()) -> DataSource:
  """The task or mixture `name` from the source `data` names (UserError for unknown names or a bad `data`).

  Args:
    name: the task or mixture (MIXTURE_OR_TASK_NAME).
    languages: the run's language list (None: the task's own).
    data: `train.data`: "seqio" (the task registry, the default) or
      "cache:DIR", the packed cache at DIR built from task `name` (its
      manifest holds the languages, pairs, vocabulary and definitions).
    register_tasks: registers the tasks a registry lookup needs (e.g. a
      run's recorded tasks); a cache needs no registry and never calls it.
    verify: `train.cache_verify`, how a cache's splits are verified ("auto",
      "full", "size"; checked whatever `data` is, so a typo never waits).
    vocabulary_files: the vocabulary files the run's own task definitions
      name (`task_vocabulary_files`): a cache must have been built with each
      (by sha256). The registry's tasks tokenise with theirs by definition.
  """
  verify = packed_format.parse_verify(verify)
  cache = packed_format.parse_source(data)
  if cache is None:
    return SeqioSource.resolve(name, languages=languages, register_tasks=register_tasks)
  return CacheSource.open(cache, name, languages=languages, verify=verify, vocabulary_files=vocabulary_files)


def task_vocabulary_files(definitions: Sequence[Any], name: str) -> list[str]:
  """The `vocabulary_path` of each of `definitions` (TextTask, TsvBitextTask, AlphaMixture) that task `name` reads.

  `name` itself, or the tasks of a mixture of that name (recursively); a
  task not defined in `definitions` (a registry task) adds nothing. Read
  by attribute, so no seqio is imported.
  """
  by_name = {getattr(d, "name", None): d for d in definitions}
  files, todo, seen = [], [name], set()
  while todo:
    current = todo.pop()
    if current in seen or current not in by_name:
      continue
    seen.add(current)
    definition = by_name[current]
    tasks = getattr(definition, "tasks", None)
    if tasks is not None:
      todo.extend([tasks] if isinstance(tasks, str) else list(tasks))
    path = getattr(definition, "vocabulary_path", None)
    if isinstance(path, str) and path not in files:
      files.append(os.path.expanduser(path))
  return files
