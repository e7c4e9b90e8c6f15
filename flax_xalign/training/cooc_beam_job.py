"""`xalign cooc_beam`'s work: count a co-occurrence table with the Apache Beam pipeline (`data.cooc.beam`).

A `BeamCoocJob` is the counting job of `xalign cooc` (`data.cooc.job.CoocJob`)
plus the pipeline's knobs. `check` refuses bad settings and applies the
local command's output checks to a local --output before Beam is needed;
`run` resolves the task (or the text files), builds the pipeline and runs it.
Inputs and output may be on any Beam filesystem (gs://, s3://, ...). It sits
in training/, beside `cooc_job`, for the same reason: the task registry (and
the pipeline module, which brings in TensorFlow) load only once the cheap
checks have passed. The printed line is the command's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Sequence
from typing import Any

from flax_xalign.data.cooc import job as cooc_job
from flax_xalign.errors import UserError

# Fields whose default is the pipeline module's: None until `check` fills them in.
_PIPELINE_DEFAULTS = {"shards": "DEFAULT_SHARDS", "lines_per_shard": "DEFAULT_LINES_PER_SHARD",
                      "buckets": "DEFAULT_BUCKETS"}


@dataclasses.dataclass(frozen=True)
class BeamCoocJob:
  """The table to count (`count`) and the pipeline's knobs (None: the pipeline module's defaults).

  Attributes:
    count: the counting job; its paths may be on any Beam filesystem.
    shards: shards per member task.
    lines_per_shard: text lines per shard.
    buckets: merge keys (row token a mod buckets).
  """

  count: cooc_job.CoocJob
  shards: int | None = None
  lines_per_shard: int | None = None
  buckets: int | None = None


def remote(path: str) -> bool:
  """Whether `path` is on a Beam filesystem other than the local one (gs://, s3://, ...); without Beam
  (checked before it is required), any URL but file://."""
  from flax_xalign.data.cooc import beam as cooc_beam
  beam = cooc_beam.beam
  if beam is None:
    return "://" in path and not path.startswith("file://")
  return beam.io.filesystems.FileSystems.get_scheme(path) not in (None, "file")


def _path(path: str) -> str:
  """An absolute local path (as the local command records it); remote paths unchanged."""
  return path if remote(path) else os.path.abspath(path)


def _text_inputs(specs: Sequence[str]) -> list[tuple[str, str]]:
  """[(path, language code)] of FILE:LANG specs; files local or on any Beam filesystem."""
  from flax_xalign.data.cooc import beam as cooc_beam
  inputs = []
  for spec in specs:
    path, sep, lang = spec.rpartition(":")
    if not sep or not path or not lang or lang.startswith("//"):
      raise UserError(f"--text {spec!r}: expected FILE:LANG, e.g. --text=corpus.en.txt:en.")
    if not cooc_beam.beam.io.filesystems.FileSystems.exists(path):
      raise UserError(f"--text {spec!r}: {path} does not exist.")
    inputs.append((path, lang))
  return inputs


def _sha256(path: str) -> str:
  """sha256 of a local or Beam-filesystem file's bytes (the vocabulary a table was counted with)."""
  if not remote(path):
    from flax_xalign.data.sources import wheels

    return wheels.sha256_of(path)
  from flax_xalign.data.cooc import beam as cooc_beam

  with cooc_beam.beam.io.filesystems.FileSystems.open(path) as f:
    return hashlib.sha256(f.read()).hexdigest()


def _check_local_paths(job: cooc_job.CoocJob) -> None:
  """The local command's checks for a local --output (new, empty or a cooc table's; none of the inputs) and
  for the local inputs, before the pipeline is built; remote paths are left to the Beam filesystem."""
  if remote(job.output):
    return
  local_texts = [spec for spec in job.texts if not remote(spec.rpartition(":")[0])]
  vocabulary = job.vocabulary if job.vocabulary and not remote(job.vocabulary) else None
  cooc_job.check_files(job.output, texts=local_texts, vocabulary=vocabulary)


def check(job: BeamCoocJob) -> BeamCoocJob:
  """The job with the pipeline's defaults filled in; UserError for a bad combination or value."""
  cooc_job.check_job(job.count)
  from flax_xalign.data.cooc import beam as cooc_beam
  job = dataclasses.replace(job, **{name: getattr(cooc_beam, default) for name, default in _PIPELINE_DEFAULTS.items()
                                    if getattr(job, name) is None})
  for flag, value, limit in (("--shards", job.shards, None), ("--lines_per_shard", job.lines_per_shard, None),
                             ("--buckets", job.buckets, cooc_beam._MAX_BUCKETS)):  # pylint: disable=protected-access
    if value < 1 or (limit is not None and value > limit):
      raise UserError(f"{flag} must be an integer in [1, {limit or 'inf'}], got {value}.")
  if job.count.texts and not job.count.vocabulary:
    raise UserError("--text needs --vocabulary=MODEL, the SentencePiece model to tokenise it with.")
  _check_local_paths(job.count)
  return job


def _task_pipeline(options: Any, job: BeamCoocJob, shared: dict[str, Any]) -> Any:
  """The pipeline counting a registered task or mixture's split."""
  from flax_xalign import tasks
  from flax_xalign.data import cooc
  from flax_xalign.data.cooc import beam as cooc_beam
  from flax_xalign.data.vocab.fingerprint import model_sha256

  count = job.count
  vocab_size = int(tasks.get_vocabulary(count.task).vocab_size)
  languages = (tuple(sorted(set(count.languages))) if count.languages is not None
               else tuple(tasks.languages_of(count.task)))
  # Workers import flax_xalign.tasks (it registers the tasks) before they read a shard.
  settings = cooc_beam.Settings(languages=languages, vocab_size=vocab_size, window=count.window,
                                buckets=job.buckets, task_modules=(tasks.__name__,))
  # A UserError for bad settings, before any pipeline is built.
  cooc.empty_counts(languages=languages, vocab_size=vocab_size, window=count.window)
  shards = cooc_beam.task_shards(count.task, split=count.split, shards=job.shards)
  source = {"task": count.task, "split": count.split,
            cooc.VOCABULARY_KEY: model_sha256(tasks.get_vocabulary(count.task))}
  pipeline = cooc_beam.beam.Pipeline(options=options)
  cooc_beam.build(pipeline, settings=settings, source=source, task_shard_list=shards, **shared)
  return pipeline


def _text_pipeline(options: Any, job: BeamCoocJob, shared: dict[str, Any]) -> Any:
  """The pipeline counting the job's text files."""
  from flax_xalign.data import cooc
  from flax_xalign.data.cooc import beam as cooc_beam

  count = job.count
  inputs = _text_inputs(count.texts)
  languages = tuple(sorted({lang for _, lang in inputs}))
  _, vocab_size = cooc_beam.sentencepiece_encoder(count.vocabulary)  # UserError for a missing or bad model.
  settings = cooc_beam.Settings(languages=languages, vocab_size=vocab_size, window=count.window,
                                buckets=job.buckets)
  source = {"files": [{"path": _path(p), "language": lang} for p, lang in inputs],
            "vocabulary": _path(count.vocabulary), cooc.VOCABULARY_KEY: _sha256(count.vocabulary)}
  pipeline = cooc_beam.beam.Pipeline(options=options)
  cooc_beam.build(pipeline, settings=settings, source=source,
                  texts=[(p, languages.index(lang)) for p, lang in inputs], vocabulary=count.vocabulary,
                  lines_per_shard=job.lines_per_shard, **shared)
  return pipeline


def run(job: BeamCoocJob, beam_args: Sequence[str] = ()) -> Any:
  """Checks the job, builds the pipeline with the Beam pipeline options `beam_args` (--runner, ...), runs it to
  the end and returns its `PipelineResult`."""
  job = check(job)
  from flax_xalign.data import cooc
  from flax_xalign.data.cooc import beam as cooc_beam

  cooc_beam.require_beam()
  from apache_beam.options.pipeline_options import PipelineOptions

  options = PipelineOptions(list(beam_args))
  count = job.count
  shared = {"output": count.output, "reference_language": count.reference_language,
            "drop_diagonal": count.drop_diagonal}
  pipeline = (_task_pipeline if count.task else _text_pipeline)(options, job, shared)
  result = pipeline.run()
  result.wait_until_finish()
  print(f"cooc_beam: wrote {count.output.rstrip('/')}/{cooc.TABLE_FILE} and {cooc.MANIFEST_FILE}")
  return result
