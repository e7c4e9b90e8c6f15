r"""Writes a packed cache as `xalign cache` does, its shards in parallel by Apache Beam workers.

  .venv-beam/bin/xalign cache_beam --task=NAME --output=DIR [--split=train] [--length=512] \
      [--examples=N | --epochs=E] [--seed=0] [--num_shards=8] [...the other flags of `xalign cache`] \
      [--runner=DirectRunner|DataflowRunner|FlinkRunner|SparkRunner ...other Beam pipeline options]
  .venv-beam/bin/xalign cache_beam --gin_file=my_run.gin --output=cache/mine --examples=200000 \
      --num_shards=2 --direct_num_workers=2 --direct_running_mode=multi_processing

(`python -m flax_xalign.cli.cache_beam` is the same command.) Every flag of
`xalign cache` applies but --workers: --num_shards=N is its Beam form. The
task is read as N seqio shards; Beam worker i writes and hashes shard i's
rows, and one final step names the files in shard order, writes the
vocabulary and the manifest last and renames the staging folder into place
(`write.commit`). The rows, shards and manifest are those of
`xalign cache --workers=N` (`--num_shards=1`: of the one-process writer),
tested on the DirectRunner (tests/data/test_cache_beam.py). Flags neither
command knows are Beam pipeline options, passed through. docs/BEAM.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from flax_xalign.cli import common
from flax_xalign.errors import ArgumentParser, UserError

DEFAULT_SHARDS = 8
HARNESS_LOG_LEVEL = "--default_sdk_harness_log_level"
RUNNERS = ("DirectRunner", "DataflowRunner", "FlinkRunner", "SparkRunner", "PortableRunner", "PrismRunner")


def _beam_flags(flags: Sequence[str]) -> tuple[list[str], list[str]]:
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


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
  """(the `xalign cache` flags with `num_shards`, the Beam pipeline options with --runner)."""
  from flax_xalign.cli import cache as cache_cli
  from flax_xalign.cli import cache_beam_pipeline

  parser = ArgumentParser(prog="xalign cache_beam", allow_abbrev=False, description=__doc__.splitlines()[0],
                          epilog="Every flag of `xalign cache --help` but --workers applies too; other flags are "
                          "Beam pipeline options (--direct_num_workers, --project, --temp_location, ...).")
  parser.add_argument("--num_shards", type=int, default=DEFAULT_SHARDS,
                      help=f"seqio shards of the task, each written by one Beam worker (default {DEFAULT_SHARDS}); "
                      "the rows are those of `xalign cache --workers=NUM_SHARDS`")
  parser.add_argument("--runner", default="DirectRunner", help=f"the Beam runner ({', '.join(RUNNERS[:4])}, ...)")
  ours, rest = parser.parse_known_args(argv)
  if ours.num_shards < 1:
    raise UserError(f"--num_shards={ours.num_shards} must be at least 1.")
  cache_beam_pipeline.require_beam()  # Beam's own flags are told apart by Beam.
  beam_flags, cache_flags = _beam_flags(rest)
  args = cache_cli.parse_args(cache_flags)
  if args.workers != 1:
    raise UserError(f"--workers={args.workers} is `xalign cache`'s flag; here --num_shards=N sets the shards Beam's "
                    "workers write.")
  args.num_shards = ours.num_shards
  if not any(flag.startswith(HARNESS_LOG_LEVEL) for flag in beam_flags):
    beam_flags.append(f"{HARNESS_LOG_LEVEL}=WARNING")  # Worker processes would log every gRPC channel at INFO.
  return args, [f"--runner={ours.runner}", *beam_flags]


def _remote_staging(args: argparse.Namespace) -> tuple[str, str]:
  """(staging prefix, target) of a split on a remote Beam file system; UserError when it is there already."""
  import uuid

  from apache_beam.io.filesystems import FileSystems

  from flax_xalign.data.packed import format as format_lib

  target = FileSystems.join(args.output, args.split)
  if args.overwrite:
    raise UserError(f"--overwrite of a split on {FileSystems.get_scheme(args.output)}:// is not supported (there "
                    f"is no folder rename there); delete {target} yourself, or write to a new --output.")
  if FileSystems.exists(FileSystems.join(target, format_lib.MANIFEST)):
    raise UserError(f"{target} already exists; choose another --output or delete it.")
  return FileSystems.join(args.output, f".{args.split}.tmp-{uuid.uuid4().hex[:12]}"), target


def plan(args: argparse.Namespace) -> tuple[dict[str, Any], bytes]:
  """(the workers' spec, as `xalign cache --workers` builds it, the vocabulary file's bytes) of the flags."""
  from flax_xalign.assets import vocabulary as vocabulary_asset
  from flax_xalign.cli import cache as cache_cli

  data = cache_cli.resolve(args)
  if data.definitions is None:
    raise UserError(f"task {args.task!r} was registered by code Beam's workers cannot run again (no task "
                    "definitions recorded); register it from a gin file or a module.")
  _, spec = cache_cli.plan(args, data, workers=args.num_shards, how=" with Beam", parts=f"{args.num_shards} shard(s)")
  return spec, vocabulary_asset.model_bytes(data.vocabulary)


def run(parsed: tuple[argparse.Namespace, list[str]]) -> Any:
  """Builds and runs the pipeline; returns the finished `PipelineResult`."""
  args, beam_flags = parsed
  from flax_xalign.data.packed import format as format_lib
  from flax_xalign.cli import cache_beam_pipeline
  from flax_xalign.data.packed import write

  is_remote = cache_beam_pipeline.remote(args.output)
  if is_remote:
    tmp, target = _remote_staging(args)  # Before TF and the task load.
  else:
    write.check_output(args.output, args.split, overwrite=args.overwrite)
  spec, vocabulary_bytes = plan(args)
  from apache_beam.options.pipeline_options import PipelineOptions

  def run_pipeline(tmp: str, target: str) -> Any:
    pipeline = cache_beam_pipeline.beam.Pipeline(options=PipelineOptions(beam_flags))
    cache_beam_pipeline.build(pipeline, spec={**spec, "tmp": tmp}, target=target, vocabulary_bytes=vocabulary_bytes)
    try:
      result = pipeline.run()
      result.wait_until_finish()
    except Exception as e:  # noqa: BLE001 -- a worker's UserError becomes one line; anything else stays.
      error = cache_beam_pipeline.worker_error(e)
      if error is None:
        raise
      raise error from None
    return result

  start = time.monotonic()
  if is_remote:
    try:
      result = run_pipeline(tmp, target)
    except BaseException:
      cache_beam_pipeline.remove_quietly(tmp)
      raise
    print(f"wrote {target} ({time.monotonic() - start:.0f} s)", flush=True)
    return result
  with write.staged(args.output, args.split, overwrite=args.overwrite) as (tmp, target):
    result = run_pipeline(os.path.abspath(tmp), os.path.abspath(target))
  with open(os.path.join(target, format_lib.MANIFEST), encoding="utf-8") as f:
    manifest = format_lib.Manifest.from_json(json.load(f), where=target)
  write.report(manifest, target, time.monotonic() - start)
  return result


def main(argv: Sequence[str] | None = None) -> int:
  return common.main_of(parse_args, run, argv)


if __name__ == "__main__":
  sys.exit(main())
