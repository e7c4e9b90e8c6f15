"""A task's rows written once as a packed split (`data/packed/`): the work of `xalign cache` and `cache_beam`.

A `CacheJob` holds the flags of `xalign cache`; `write_cache(job)` writes
OUTPUT/<split>/ as the command does: the output checked before TensorFlow
and the task load, the task's seqio source resolved (a cache holds the seqio
pipeline's own rows, so seqio stays the one task registry), the split's
manifest planned, its rows written by one process, by `workers` processes
(`data.packed.parallel`) or, with `write_cache_beam`, by Apache Beam
(`data.packed.beam`); a bucket URL is written locally, then uploaded
(`data.packed.upload`). The tasks must be registered with seqio first.

The commands' gin settings (a run's task, row length, seed, ...) reach a job
through `fill`, a callable the command passes (only cli/ reads gin): it is
called once the output is checked and the libraries are in, with Ctrl-C
polled, and fills the fields left None (`fill_from_bindings`). Fields left
None after it take the command's defaults: length 512, seed 0, pair layout
"restart", one direction, one epoch, word links when a task has them.

The worker processes (and Beam's workers) find the task again through
`seqio_source`, a top-level function of this module, so they can import it;
`worker_setup` (a command passes its process set-up, `flax_xalign.cli.setup_process`)
runs first in each of them. The two commands' shared flags, and the CacheJob they make, are the edge's
(`cli/cache_flags.py`).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from flax_xalign import errors
from flax_xalign.errors import UserError

PAIR_LAYOUTS = ("restart", "continuous")  # flax_xalign.data.vocab.specials.PAIR_LAYOUTS, without importing it.


@dataclasses.dataclass(frozen=True, kw_only=True)
class CacheJob:
  """What to write: the flags of `xalign cache` (None: the gin run's setting via `fill`, else the default)."""

  task: str | None  # A registered seqio task or mixture (None: the gin run's MIXTURE_OR_TASK_NAME).
  split: str = "train"
  output: str  # Cache folder or bucket URL (gs://...); the split goes to OUTPUT/<split>/.
  length: int | None = None  # Row length (None: 512).
  examples: int | None = None  # Rows of the endless shuffled stream; None: `epochs` passes.
  epochs: int | None = None  # Passes over the split (None: 1).
  seed: int | None = None  # Seed of the written order (None: 0).
  languages: tuple[str, ...] | None = None  # train.languages (None: the gin run's, else the task's; (): the task's).
  pair_layout: str | None = None  # train.pair_layout (None: "restart").
  both_directions: bool | None = None  # train.bitext_both_directions (None: False).
  pack: bool = True  # False: one example per row (padding).
  links: bool | None = None  # Store the tasks' word links (None: when a task has links).
  shard_mb: int = 256
  overwrite: bool = False  # Replace an existing OUTPUT/<split>.
  workers: int = 1  # Processes writing in parallel, one seqio shard each (1: the one-stream order).


Fill = Callable[[CacheJob], CacheJob]
WorkerSetup = Callable[[], None]


# ---------------------------------------------------------------- a gin run's settings


def fill_from_bindings(job: CacheJob, bound: Mapping[str, Any]) -> CacheJob:
  """Registers the run's user tasks and takes its `train.*` settings (`bound`, unresolved) for every field left
  None. A value is resolved (`copy.deepcopy`: macros and references) only when it is read."""
  def setting(name, default=None):
    try:
      return copy.deepcopy(bound[name]) if name in bound else default  # Resolves macros and references.
    except (ValueError, KeyError) as e:
      raise UserError(f"gin configuration error: {str(e).strip().splitlines()[0]}") from None

  for spec in setting("user_tasks", ()):
    spec.register()
  task = job.task or setting("mixture_or_task_name")
  if not task:
    raise UserError("the gin run sets no MIXTURE_OR_TASK_NAME; pass --task=NAME.")
  length = job.length or int(dict(setting("task_feature_lengths", {})).get("tokens", 0)) or None
  seed = setting("seed", 0) if job.seed is None else job.seed
  pair_layout = job.pair_layout or setting("pair_layout")
  both_directions = setting("bitext_both_directions") if job.both_directions is None else job.both_directions
  languages, run_languages = job.languages, setting("languages")
  if languages is None and run_languages:
    languages = tuple(l for l in ",".join(run_languages).split(",") if l)  # (as the flag would spell them)
  links = job.links
  if links is None and _objectives_read_links(setting("objectives", {}), setting("monitors", ()),
                                              setting("objective_options", {})):
    links = True
  return dataclasses.replace(job, task=task, length=length, seed=seed, pair_layout=pair_layout,
                             both_directions=both_directions, languages=languages, links=links)


def _objectives_read_links(objectives, monitors, options) -> bool:
  """Whether an objective (or monitor) of the gin run reads the batch feature `link_groups`."""
  from flax_xalign.objectives import base as objectives_lib

  names = [*(objectives or {}), *(n for n in (monitors or ()) if n not in (objectives or {}))]
  built = objectives_lib.build(names, options or {})
  return any("link_groups" in getattr(objective, "batch_features", ()) for objective in built.values())


def task_has_links(definitions) -> bool:
  """Whether a task behind the definitions was given word links (`TsvBitextTask(links=...)`)."""
  return any(d.get("kind") == "TsvBitextTask" and (d.get("args") or {}).get("links") for d in definitions or ())


# ---------------------------------------------------------------- the task and the plan


def resolve(job: CacheJob, fill: Fill | None = None) -> tuple[CacheJob, Any]:
  """(the job, `fill`ed and its defaults in, the task's seqio source with its split checked)."""
  from flax_xalign.training.seqio_source import SeqioSource

  if fill is not None:
    job = fill(job)
  job = dataclasses.replace(job, length=job.length or 512, seed=job.seed or 0,
                            pair_layout=job.pair_layout or "restart", both_directions=bool(job.both_directions))
  data = SeqioSource.resolve(job.task, languages=_languages(job))  # A cache holds the seqio pipeline's rows.
  if not data.has_split(job.split):
    raise UserError(f"task {job.task!r} has no {job.split!r} split (or a task of the mixture lacks it); "
                    "name one it has with --split.")
  return job, data


def _languages(job: CacheJob) -> list[str] | None:
  return list(job.languages) if job.languages else None  # (None or (): the task's languages)


def seqio_source(spec: Mapping[str, Any]) -> Any:
  """The task's seqio source in a worker process: the task registered again from its definitions, then resolved.

  What `data.packed.parallel` and `data.packed.beam` are handed as `source_of`.
  """
  from flax_xalign import tasks
  from flax_xalign.training.seqio_source import SeqioSource

  if spec["definitions"]:
    tasks.registry.register_described(spec["definitions"])
  return SeqioSource.resolve(spec["task"], languages=spec["languages"])


def plan(job: CacheJob, data: Any, *, workers: int, how: str = "",
         parts: str | None = None) -> tuple[Any, dict[str, Any]]:
  """(the split's manifest before its rows, the spec `data.packed.parallel` writes shard i of) of a `resolve`d job.

  `workers` seqio shards (1: the one-process stream); `how` and `parts` go into the progress line.
  """
  from flax_xalign.data.packed import parallel
  from flax_xalign.data.packed import write

  train = job.split == "train"
  epochs = None if job.examples else (job.epochs or 1)
  if data.is_mixture and epochs is not None and train:
    print(f"note: --epochs reads each task of mixture {job.task} once per pass (its sampling rates apply only to "
          "the endless stream); --examples=N writes N rows sampled at the mixture's rates", flush=True)
  order = ({"shuffled": train, "examples": job.examples} if job.examples else
           {"shuffled": train, "epochs": epochs})
  if workers > 1:
    order["workers"] = workers  # `xalign cache --workers=N` and `cache_beam --num_shards=N` write the same rows.
  links = task_has_links(data.definitions) if job.links is None else job.links
  info = write.split_info(
      task=job.task, split=job.split, length=job.length, pack=job.pack, pair_layout=job.pair_layout,
      both_directions=job.both_directions, languages=data.languages, language_pairs=data.language_pairs,
      vocabulary=data.vocabulary_spec, task_definitions=data.definitions, seed=job.seed, order=order, links=links)
  print(f"caching {job.task}/{job.split}{how}: rows of {job.length} tokens, languages {list(data.languages)}, "
        + (f"{job.examples:,} rows" if job.examples else f"{epochs} epoch(s)")
        + (", with word links (link_groups)" if links else "")
        + (f", {parts}" if parts else ""), flush=True)
  spec = dict(task=job.task, definitions=data.definitions, languages=_languages(job), split=job.split,
              length=job.length, seed=job.seed, shuffle=train, pack=job.pack, epochs=epochs,
              pair_layout=job.pair_layout, both_directions=job.both_directions, links=links, workers=workers,
              max_rows=parallel.split_rows(job.examples, workers), shard_bytes=job.shard_mb << 20, info=info)
  return info, spec


# ---------------------------------------------------------------- writing (`xalign cache`)


def write_cache(job: CacheJob, *, fill: Fill | None = None, worker_setup: WorkerSetup | None = None) -> None:
  """Writes the job's split into job.output (a folder, or a bucket URL: written locally, then uploaded).

  Prints what `xalign cache` prints (the plan's line, progress, `wrote ...`); one UserError for bad input.
  `fill` takes the gin run's settings (see the module docstring); `worker_setup` runs first in each of the
  `job.workers` processes (picklable: a top-level function), when there are several.
  """
  from flax_xalign import storage

  if storage.is_url(job.output):
    # A bucket: the split is written into a local folder exactly as below, then uploaded (`data.packed.upload`).
    with errors.interrupts_held():  # (see _import_libraries)
      from flax_xalign.data.packed import upload

    with upload.written_locally(job.output, job.split, overwrite=job.overwrite) as local:  # Checks first.
      _write_local(dataclasses.replace(job, output=local, overwrite=False), fill, worker_setup)
    return
  _write_local(job, fill, worker_setup)


def _write_local(job: CacheJob, fill: Fill | None, worker_setup: WorkerSetup | None) -> None:
  with errors.interrupts_held():  # (see _import_libraries)
    from flax_xalign.data.packed import write

  write.check_output(job.output, job.split, overwrite=job.overwrite)  # Before TF and the task load.
  resolved = None
  if not os.path.isdir(job.output):
    # No writer can hold the split's lock in a folder that is not there yet, so nothing is lost by checking
    # the task (and the gin run) first: a bad task is then refused before any folder is made.
    with errors.interrupts_held():
      _import_libraries()
    with errors.interrupts_polled():
      resolved = resolve(job, fill)
  with write.split_lock(job.output, job.split):  # A second writer of the split is refused now, not at its end.
    with errors.interrupts_held():
      _import_libraries()
    # TensorFlow builds and runs the pipeline from here on: a Ctrl-C is taken between its steps, where
    # `_write` and the row loop check for one, never inside its native code (see errors.interrupts_polled).
    with errors.interrupts_polled():
      _write(*(resolved or resolve(job, fill)), worker_setup)


def _import_libraries() -> None:
  """Imports the native libraries the write needs (TensorFlow, seqio, JAX; ~8 s), to call with Ctrl-C held.

  A Ctrl-C in the middle of one of these imports left a half-initialised
  extension behind, and the process aborted at exit (SIGABRT, a traceback)
  instead of the one-line interrupt; held, it is taken once they are in.
  """
  import flax_xalign.tasks  # noqa: F401  (seqio, TensorFlow)
  from flax_xalign.assets import vocabulary  # noqa: F401  (JAX)
  from flax_xalign.training import seqio_source  # noqa: F401


def _write(job: CacheJob, data: Any, worker_setup: WorkerSetup | None) -> None:
  """Writes the split of a `resolve`d job, holding its lock."""
  from flax_xalign.assets import vocabulary as vocabulary_asset
  from flax_xalign.data.packed import parallel
  from flax_xalign.data.packed import write

  errors.check_interrupt()
  info, spec = plan(job, data, workers=job.workers, parts=f"{job.workers} workers" if job.workers > 1 else None)
  vocabulary_bytes = vocabulary_asset.model_bytes(data.vocabulary)
  if job.workers == 1:
    rows = parallel.shard_rows(data, spec, 0)
    errors.check_interrupt()
    write.write_split(rows, info, output=job.output, vocabulary_bytes=vocabulary_bytes, max_rows=job.examples,
                      shard_bytes=spec["shard_bytes"], overwrite=job.overwrite)
    return
  start = time.monotonic()
  with write.staged(job.output, job.split, overwrite=job.overwrite) as (tmp, target):
    parts = parallel.write_parallel({**spec, "tmp": tmp}, source_of=seqio_source, setup=worker_setup)
    manifest = write.commit(tmp, info, parts, target=target, vocabulary_bytes=vocabulary_bytes)
  write.report(manifest, target, time.monotonic() - start)


# ---------------------------------------------------------------- writing with Apache Beam (`xalign cache_beam`)


def write_cache_beam(job: CacheJob, beam_flags: Sequence[str], *, num_shards: int, fill: Fill | None = None,
                     worker_setup: WorkerSetup | None = None) -> Any:
  """Writes the job's split with a Beam pipeline of `num_shards` seqio shards; returns its `PipelineResult`.

  `beam_flags`: Beam's pipeline options (--runner=...). The split is that of `xalign cache --workers=N`.
  """
  from flax_xalign.data.packed import beam as packed_beam
  from flax_xalign.data.packed import format as format_lib
  from flax_xalign.data.packed import write

  is_remote = packed_beam.remote(job.output)
  if is_remote:
    tmp, target = packed_beam.remote_staging(job.output, job.split, overwrite=job.overwrite)  # Before TF loads.
  else:
    write.check_output(job.output, job.split, overwrite=job.overwrite)
  spec, vocabulary_bytes = _beam_plan(job, num_shards, fill)

  def run(tmp: str, target: str) -> Any:
    return packed_beam.run_pipeline(beam_flags, spec={**spec, "tmp": tmp}, target=target,
                                    vocabulary_bytes=vocabulary_bytes, source_of=seqio_source, setup=worker_setup)

  start = time.monotonic()
  if is_remote:
    try:
      result = run(tmp, target)
    except BaseException:
      packed_beam.remove_quietly(tmp)
      raise
    print(f"wrote {target} ({time.monotonic() - start:.0f} s)", flush=True)
    return result
  with write.staged(job.output, job.split, overwrite=job.overwrite) as (tmp, target):
    result = run(os.path.abspath(tmp), os.path.abspath(target))
  with open(os.path.join(target, format_lib.MANIFEST), encoding="utf-8") as f:
    manifest = format_lib.Manifest.from_json(json.load(f), where=target)
  write.report(manifest, target, time.monotonic() - start)
  return result


def _beam_plan(job: CacheJob, num_shards: int, fill: Fill | None) -> tuple[dict[str, Any], bytes]:
  """(the workers' spec, as `xalign cache --workers` builds it, the vocabulary file's bytes) of the job."""
  from flax_xalign.assets import vocabulary as vocabulary_asset

  job, data = resolve(job, fill)
  if data.definitions is None:
    raise UserError(f"task {job.task!r} was registered by code Beam's workers cannot run again (no task "
                    "definitions recorded); register it from a gin file or a module.")
  _, spec = plan(job, data, workers=num_shards, how=" with Beam", parts=f"{num_shards} shard(s)")
  return spec, vocabulary_asset.model_bytes(data.vocabulary)
