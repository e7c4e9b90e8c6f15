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

from collections.abc import Callable, Sequence
from typing import Any

from flax_xalign.data.packed import format as packed_format
from flax_xalign.training.cache_source import CacheSource
from flax_xalign.training.data_source import DataSource
from flax_xalign.training.seqio_source import SeqioSource


def resolve_task(name: str, *, languages: Sequence[str] | None = None, data: str = "seqio",
                 register_tasks: Callable[[], Any] | None = None) -> DataSource:
  """The task or mixture `name` from the source `data` names (UserError for unknown names or a bad `data`).

  Args:
    name: the task or mixture (MIXTURE_OR_TASK_NAME).
    languages: the run's language list (None: the task's own).
    data: `train.data`: "seqio" (the task registry, the default) or
      "cache:DIR", the packed cache at DIR built from task `name` (its
      manifest holds the languages, pairs, vocabulary and definitions).
    register_tasks: registers the tasks a registry lookup needs (e.g. a
      run's recorded tasks); a cache needs no registry and never calls it.
  """
  cache = packed_format.parse_source(data)
  if cache is None:
    return SeqioSource.resolve(name, languages=languages, register_tasks=register_tasks)
  return CacheSource.open(cache, name, languages=languages)
