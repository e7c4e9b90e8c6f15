"""The Apache Beam pipeline of `xalign cache_beam`: seqio shards written by workers, one commit at the end.

Shape of the pipeline (`training.cache_job.write_cache_beam` builds and runs it for the command,
`flax_xalign.cli.cache_beam`):

1. Shards. `--num_shards=N` elements 0..N-1, spread over the workers
   (`Reshuffle`: `Create` is a single split otherwise).
2. Per shard, `write_shard`: the worker finds the task through the
   caller's `source_of(spec)` (the training layer's registers it from its
   definitions), reads seqio shard i of N of it (`parallel.shard_rows`,
   the very rows `xalign cache --workers=N` gives its worker i), writes them
   as ArrayRecord files with `write.write_rows` and hashes each file. Its
   file names carry a per-attempt token, so a retried or speculative
   attempt of the same shard never writes into the other's files.
3. Once every shard is written, `commit_split` (one worker) keeps the files
   of the attempts the runner reported, removes any other attempt's, and
   hands them to `write.commit` in shard order: named `shard-*`, hashed,
   vocabulary and manifest written last, the staging folder renamed into
   place. The manifest is then that of `xalign cache --workers=N`
   (`--num_shards=1`: of the one-process writer), shard hashes included.

An --output on another Beam file system (gs://, s3://, ...: `remote`) has
no folder rename: each worker writes its files on its own disk, hashes them
and copies them into a staging prefix `OUTPUT/.<split>.tmp-<token>/` under
names fixed by (shard, file) (rows are deterministic, so a retried attempt
writes the same bytes); `commit_remote` moves them to `OUTPUT/<split>/` under
their shard names, writes the vocabulary, then the manifest, last: until the
manifest exists, no reader sees a split (`format.open_split` refuses it).

Functions here are referred to by module, so Beam pickles them under a name
its workers can import; so must the caller's `source_of` and `setup` be (top-level
functions of an importable module, not of a command run as `__main__`). The module
imports Apache Beam when it has it (the `beam` extra: docs/BEAM.md); it knows no task
registry and no command.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from flax_xalign.errors import UserError

try:
  import apache_beam as beam
except ImportError:  # The main environment: `require_beam` names the extra.
  beam = None

INSTALL_HINT = ("make install-beam (python3.11 -m venv .venv-beam; pip install -e '.[beam]': Apache Beam needs "
                "protobuf < 7, docs/BEAM.md), then run .venv-beam/bin/xalign cache_beam")
METRICS_NAMESPACE = "cache_beam"
PART_SUFFIX = ".array_record"


def require_beam() -> Any:
  """The apache_beam module, or a UserError naming the extra to install."""
  if beam is None:
    import sys

    raise UserError(f"xalign cache_beam needs Apache Beam, which is not installed in this environment "
                    f"({sys.executable}); install it with: {INSTALL_HINT}.")
  return beam


def worker_error(error: BaseException) -> UserError | None:
  """The UserError a worker raised, out of the runner's exception (None for any other failure).

  The in-process DirectRunner re-raises it with "[while running ...]" added; a
  runner of other processes (multi_processing, Dataflow) reports it as text
  in the traceback it relays.
  """
  import re

  if isinstance(error, UserError):
    return UserError(str(error).split(" [while running", 1)[0].strip())
  found = re.search(r"UserError: (.+)", str(error))
  return UserError(found.group(1).split(" [while running", 1)[0].strip()) if found else None


def part_prefix(index: int, attempt: str) -> str:
  """File prefix of shard `index`'s files written by one attempt (`attempt`: a random token)."""
  return f"part{index:05d}.{attempt}"


def remote(path: str) -> bool:
  """Whether `path` is on a Beam file system other than the local one (gs://, s3://, hdfs://, ...)."""
  if beam is None:
    return "://" in path and not path.startswith("file://")
  return beam.io.filesystems.FileSystems.get_scheme(path) not in (None, "file")


def write_shard(index: int, spec: Mapping[str, Any], source_of: Callable[[Mapping[str, Any]], Any],
                setup: Callable[[], None] | None = None) -> list[tuple[int, int, str, int, int, str]]:
  """Worker: seqio shard `index` of spec['workers'] written into spec['tmp'] (a local folder or a remote prefix).

  `setup` runs first (the command's process set-up: TensorFlow quiet and off the accelerators); `source_of(spec)`
  is the task's source (`parallel.SourceOf`). Returns [(index, k, file name, rows, bytes, sha256)] of its files,
  k the file's place in the shard.
  """
  if setup is not None:
    setup()
  from flax_xalign.data.packed import parallel
  from flax_xalign.data.packed import write
  from flax_xalign.data.sources.wheels import sha256_of

  data = source_of(spec)
  if data.vocabulary_spec.sha256 != spec["info"].vocabulary.sha256:  # E.g. a vocabulary trained again there.
    raise UserError(f"worker of shard {index}: task {spec['task']!r} has vocabulary sha256 "
                    f"{data.vocabulary_spec.sha256[:12]}..., the launching machine's is "
                    f"{spec['info'].vocabulary.sha256[:12]}...; give the workers the same vocabulary file.")
  rows = parallel.shard_rows(data, spec, index)
  is_remote = remote(spec["tmp"])
  directory = tempfile.mkdtemp(prefix="cache_beam-") if is_remote else spec["tmp"]
  try:
    parts = write.write_rows(rows, directory, spec["info"], prefix=part_prefix(index, uuid.uuid4().hex[:12]),
                             max_rows=spec["max_rows"][index], shard_bytes=spec["shard_bytes"])
    out = []
    for k, (name, count) in enumerate(parts):
      path = os.path.join(directory, name)
      size, sha256 = os.path.getsize(path), sha256_of(path)
      if is_remote:  # A name fixed by (shard, file): a retried attempt overwrites it with the same bytes.
        name = f"part{index:05d}-{k:05d}{PART_SUFFIX}"
        _copy_out(path, beam.io.filesystems.FileSystems.join(spec["tmp"], name))
        os.remove(path)
      out.append((index, k, name, count, size, sha256))
  finally:
    if is_remote:
      shutil.rmtree(directory, ignore_errors=True)
  if beam is not None:
    beam.metrics.Metrics.counter(METRICS_NAMESPACE, "shards").inc()
    beam.metrics.Metrics.counter(METRICS_NAMESPACE, "rows").inc(sum(rows for _, rows in parts))
  return out


def _copy_out(path: str, destination: str) -> None:
  """Copies a local file to a Beam file system path, in 16 MiB pieces."""
  with open(path, "rb") as src, beam.io.filesystems.FileSystems.create(destination) as dst:
    shutil.copyfileobj(src, dst, 16 << 20)


def _put(destination: str, data: bytes) -> None:
  with beam.io.filesystems.FileSystems.create(destination) as dst:
    dst.write(data)


def ordered_parts(files: Sequence[tuple[int, int, str, int, int, str]]) -> list[tuple[int, int, str, int, int, str]]:
  """The workers' files in shard then file order; UserError when one shard comes from two attempts.

  A runner reports each element's output once (the attempt it kept); a shard
  with no rows has no file.
  """
  files = sorted(files)
  attempts: dict[int, set[str]] = {}
  for index, _, name, *_ in files:
    attempts.setdefault(index, set()).add(name.rsplit("-", 1)[0])
  doubled = sorted(index for index, prefixes in attempts.items() if len(prefixes) > 1)
  if doubled:
    raise UserError(f"the runner reported shard(s) {doubled} twice (two attempts); rerun the command.")
  return files


def commit_split(unused_element: Any, files: list, *, spec: Mapping[str, Any], target: str,
                 vocabulary_bytes: bytes) -> str:
  """The final step: the reported files -> `write.commit` (manifest last, staging folder renamed into place).

  Returns `target`. The workers' sha256 of each file is checked against the commit's own.
  """
  del unused_element
  from flax_xalign.data.packed import write

  files = ordered_parts(files)
  kept = {name for *_, name, _, _, _ in files}
  for name in os.listdir(spec["tmp"]):  # Files of attempts the runner did not keep.
    if name.startswith("part") and name.endswith(PART_SUFFIX) and name not in kept:
      os.remove(os.path.join(spec["tmp"], name))
  for _, _, name, _, size, _ in files:
    got = os.path.getsize(os.path.join(spec["tmp"], name))
    if got != size:
      raise UserError(f"{name} has {got} bytes, its worker wrote {size}: another writer is using "
                      f"{spec['tmp']}; rerun the command.")
  manifest = write.commit(spec["tmp"], spec["info"], [(name, rows) for _, _, name, rows, _, _ in files],
                          target=target, vocabulary_bytes=vocabulary_bytes)
  for shard, (_, _, name, _, _, sha256) in zip(manifest.shards, files):
    if shard.sha256 != sha256:
      raise UserError(f"{target}/{shard.file} ({name}) changed between its worker and the commit; rebuild the "
                      "split (--overwrite).")
  return target


def commit_remote(unused_element: Any, files: list, *, spec: Mapping[str, Any], target: str,
                  vocabulary_bytes: bytes) -> str:
  """The final step on a remote file system: shards moved to `target`, vocabulary, then the manifest, last.

  The manifest is `write.commit`'s, with the sizes and sha256 the workers measured on their own disks.
  """
  del unused_element
  import flax_xalign
  from flax_xalign import fileio
  from flax_xalign.data.packed import format as format_lib
  from flax_xalign.data.packed import write

  filesystems = beam.io.filesystems.FileSystems
  files = ordered_parts(files)
  info = spec["info"]
  if not files or sum(rows for _, _, _, rows, _, _ in files) == 0:
    raise UserError(f"{info.task} gave no {info.split!r} rows of length {info.length}; check the task's files "
                    "for that split.")
  names = [format_lib.shard_name(i) for i in range(len(files))]
  filesystems.rename([filesystems.join(spec["tmp"], f[2]) for f in files], [filesystems.join(target, n) for n in names])
  if hashlib.sha256(vocabulary_bytes).hexdigest() != info.vocabulary.sha256:
    raise ValueError("the vocabulary bytes do not match the vocabulary record's sha256")
  _put(filesystems.join(target, info.vocabulary.file), vocabulary_bytes)
  shards = tuple(format_lib.Shard(file=name, examples=rows, bytes=size, sha256=sha256)
                 for name, (_, _, _, rows, size, sha256) in zip(names, files))
  manifest = dataclasses.replace(info, examples=sum(s.examples for s in shards), shards=shards,
                                 writer=flax_xalign.__version__)
  # The writer's mark before the manifest (the commit point), as `write.commit` leaves it on a local disk.
  _put(filesystems.join(target, fileio.MARK),
       fileio.mark_text(write.COMMAND, [*names, info.vocabulary.file, format_lib.MANIFEST]).encode())
  _put(filesystems.join(target, format_lib.MANIFEST), (json.dumps(manifest.to_json(), indent=1) + "\n").encode())
  remove_quietly(spec["tmp"])
  return target


def remove_quietly(path: str) -> None:
  """Deletes a remote staging prefix (and all under it); a failure to is left to the user's lifecycle rules."""
  try:
    beam.io.filesystems.FileSystems.delete([path.rstrip("/") + "/"])
  except Exception:  # noqa: BLE001 -- best effort: the split is committed (or the run failed) either way.
    pass


def build(pipeline: Any, *, spec: Mapping[str, Any], target: str, vocabulary_bytes: bytes,
          source_of: Callable[[Mapping[str, Any]], Any], setup: Callable[[], None] | None = None) -> Any:
  """Adds the writing pipeline to `pipeline`; returns the PCollection of the committed split's folder."""
  beam = require_beam()  # pylint: disable=redefined-outer-name
  files = (pipeline
           | "Shards" >> beam.Create(list(range(spec["workers"])))
           | "Spread" >> beam.Reshuffle()
           | "WriteShard" >> beam.FlatMap(write_shard, spec, source_of, setup))
  commit = commit_remote if remote(spec["tmp"]) else commit_split
  return (pipeline
          | "Once" >> beam.Create([None])
          | "Commit" >> beam.Map(commit, beam.pvalue.AsList(files), spec=spec, target=target,
                                 vocabulary_bytes=vocabulary_bytes))


def run_pipeline(beam_flags: Sequence[str], *, spec: Mapping[str, Any], target: str, vocabulary_bytes: bytes,
                 source_of: Callable[[Mapping[str, Any]], Any], setup: Callable[[], None] | None = None) -> Any:
  """Builds the pipeline with Beam's options `beam_flags` and runs it to its end; returns its `PipelineResult`.

  A worker's UserError comes back as one UserError; any other failure as the runner raised it.
  """
  from apache_beam.options.pipeline_options import PipelineOptions

  pipeline = require_beam().Pipeline(options=PipelineOptions(list(beam_flags)))
  build(pipeline, spec=spec, target=target, vocabulary_bytes=vocabulary_bytes, source_of=source_of, setup=setup)
  try:
    result = pipeline.run()
    result.wait_until_finish()
  except Exception as e:  # noqa: BLE001 -- a worker's UserError becomes one line; anything else stays.
    error = worker_error(e)
    if error is None:
      raise
    raise error from None
  return result


def split_flags(flags: Sequence[str]) -> tuple[list[str], list[str]]:
  """(Beam's pipeline options, the rest) of `flags`, by the options Beam's installed option classes declare."""
  from apache_beam.options import pipeline_options

  parser = argparse.ArgumentParser(allow_abbrev=False, add_help=False)
  for cls in {str(c): c for c in pipeline_options.PipelineOptions.__subclasses__()}.values():
    cls._add_argparse_args(parser)  # pylint: disable=protected-access -- how Beam collects its own flags.
  _, rest = parser.parse_known_args(flags)
  rest_left = list(rest)
  beam_flags = []
  for flag in flags:  # Keep each flag's place: a value that is its own word follows its flag.
    if rest_left and flag == rest_left[0]:
      rest_left.pop(0)
    else:
      beam_flags.append(flag)
  return beam_flags, list(rest)


def remote_staging(output: str, split: str, *, overwrite: bool) -> tuple[str, str]:
  """(staging prefix, target) of a split on a remote Beam file system; UserError when it is there already."""
  from flax_xalign.data.packed import format as format_lib

  filesystems = require_beam().io.filesystems.FileSystems
  target = filesystems.join(output, split)
  if overwrite:
    raise UserError(f"--overwrite of a split on {filesystems.get_scheme(output)}:// is not supported (there "
                    f"is no folder rename there); delete {target} yourself, or write to a new --output.")
  if filesystems.exists(filesystems.join(target, format_lib.MANIFEST)):
    raise UserError(f"{target} already exists; choose another --output or delete it.")
  return filesystems.join(output, f".{split}.tmp-{uuid.uuid4().hex[:12]}"), target
