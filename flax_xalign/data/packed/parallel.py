"""A split written by N processes, each the rows of one seqio shard (`xalign cache --workers=N`).

The task's examples are split into N shards (seqio's `ShardInfo`, as
`data_shards` does for training) and worker i writes the converted rows of
shard i into the split's temporary folder; the parent then names the shards
in worker order, hashes them and writes the manifest (`write.commit`). Each
worker is a fresh Python (multiprocessing "spawn": TensorFlow is not fork
safe) that finds the task again through the caller's `source_of(spec)` (the
training layer's re-registers it from its definitions, so a task registered
by code the workers cannot rerun is refused). The rows are the union of the
N shard streams: not the one-stream order of `--workers=1` (training
reshuffles them all by its seed anyway), and the manifest records N.

This module knows no task registry and no command: the caller hands the
worker its row source and its process set-up as picklable top-level
callables (`SourceOf`, `Setup`), as `data.cooc.beam` is handed the modules
that register its tasks.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from flax_xalign import errors
from flax_xalign.errors import UserError

POLL_S = 1.0

# spec -> the task's resolved source (`provider`, `languages`, `vocabulary_spec`: a `SeqioSource`), in a worker.
SourceOf = Callable[[Mapping[str, Any]], Any]
# Called first in each worker process (a command's process set-up: TensorFlow quiet and off the accelerators).
Setup = Callable[[], None]


def _part(index: int) -> str:
  return f"part{index:04d}"


def shard_rows(data: Any, spec: Mapping[str, Any], index: int):
  """The converted rows of seqio shard `index` of spec['workers'] (all rows for one worker), as NumPy dicts.

  They are the rows of the stream a run's `get_dataset` batches (batch size 1, in that order), with
  `link_groups` when spec['links'].
  """
  from flax_xalign.data import pipeline

  return pipeline.get_dataset(
      data.provider, languages=data.languages, split=spec["split"], feature_lengths={"tokens": spec["length"]},
      batch_size=1, seed=spec["seed"], shuffle=spec["shuffle"], pack=spec["pack"], num_epochs=spec["epochs"],
      specials=data.vocabulary_spec.specials, pair_layout=spec["pair_layout"],
      both_directions=spec["both_directions"], links=spec.get("links", False), shard_id=index,
      num_shards=spec["workers"]).unbatch().as_numpy_iterator()


def write_part(spec: Mapping[str, Any], counts: Any, index: int, source_of: SourceOf,
               setup: Setup | None = None) -> None:
  """Worker `index`: writes its shard's rows into spec['tmp'] and lists them in part<index>.json."""
  if setup is not None:
    setup()
  try:
    from flax_xalign.data.packed import write

    rows = shard_rows(source_of(spec), spec, index)

    def progress(count: int) -> None:
      counts[index] = count

    parts = write.write_rows(rows, spec["tmp"], spec["info"], prefix=_part(index), max_rows=spec["max_rows"][index],
                             shard_bytes=spec["shard_bytes"], progress=progress)
    with open(os.path.join(spec["tmp"], _part(index) + ".json"), "w") as f:
      json.dump(parts, f)
  except BaseException as e:  # noqa: BLE001 -- reported to the parent as one line, then this worker fails.
    with open(os.path.join(spec["tmp"], _part(index) + ".error"), "w") as f:
      f.write(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
    sys.exit(1)


def split_rows(total: int | None, workers: int) -> list[int | None]:
  """Rows per worker: `total` shared out as evenly as possible (None: each writes its shard's stream)."""
  if total is None:
    return [None] * workers
  return [total // workers + (1 if i < total % workers else 0) for i in range(workers)]


def write_parallel(spec: dict[str, Any], *, source_of: SourceOf, setup: Setup | None = None,
                   report_every_s: float = 10.0) -> list[tuple[str, int]]:
  """Runs spec['workers'] workers into spec['tmp']; [(shard file, rows)] in worker order, or one UserError.

  `source_of` and `setup` go to each worker (pickled: top-level functions of an importable module).
  """
  if spec["definitions"] is None:
    raise UserError(f"task {spec['task']!r} was registered by code the worker processes cannot run again (no "
                    "task definitions recorded); use --workers=1, or register it from a gin file or a module.")
  from flax_xalign.data.packed import write

  workers = spec["workers"]
  context = multiprocessing.get_context("spawn")
  counts = context.Array("q", workers, lock=False)
  procs = [context.Process(target=write_part, args=(spec, counts, i, source_of, setup), daemon=True,
                           name=f"cache-worker-{i}") for i in range(workers)]
  start = last = time.monotonic()
  # A SIGTERM to this process stops the workers first (without it the daemon workers outlive a killed
  # parent): raised as errors.Terminated, it runs the clean-up below and the caller's, as a Ctrl-C does.
  with errors.sigterm_raises():
    try:
      for proc in procs:
        proc.start()
      while any(proc.is_alive() for proc in procs):
        time.sleep(POLL_S)
        errors.check_interrupt()  # (`xalign cache` waits with Ctrl-C polled)
        now = time.monotonic()
        if now - last >= report_every_s:
          last = now
          print(write.progress_line(sum(counts), spec["length"], now - start) + f" ({workers} workers)",
                flush=True)
    finally:
      for proc in procs:
        if proc.is_alive():
          proc.terminate()
        if proc.pid is not None:
          proc.join()
  return _gathered(spec, procs)


def _gathered(spec: Mapping[str, Any], procs: list[Any]) -> list[tuple[str, int]]:
  """The finished workers' [(shard file, rows)] in worker order; a failed worker's error as one UserError."""
  parts = []
  for index, proc in enumerate(procs):
    error = os.path.join(spec["tmp"], _part(index) + ".error")
    if os.path.exists(error):
      with open(error) as f:
        raise UserError(f"cache worker {index}: {f.read().strip()}")
    if proc.exitcode != 0:
      raise UserError(f"cache worker {index} ended with exit status {proc.exitcode} (killed? out of memory?); "
                      "rerun with fewer --workers.")
    with open(os.path.join(spec["tmp"], _part(index) + ".json")) as f:
      parts += [(name, rows) for name, rows in json.load(f)]
    os.remove(os.path.join(spec["tmp"], _part(index) + ".json"))
  return parts
