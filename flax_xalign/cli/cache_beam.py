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
import functools
import sys
from collections.abc import Sequence
from typing import Any

from flax_xalign.cli import common
from flax_xalign.errors import ArgumentParser, UserError
from flax_xalign.cli import cache_flags
from flax_xalign.training import cache_job

DEFAULT_SHARDS = 8
HARNESS_LOG_LEVEL = "--default_sdk_harness_log_level"
RUNNERS = ("DirectRunner", "DataflowRunner", "FlinkRunner", "SparkRunner", "PortableRunner", "PrismRunner")


def _gin_flags(rest: list[str]) -> Any:
  from flax_xalign.cli import gin_cli

  return gin_cli.parse_args(rest, description=cache_flags.DESCRIPTION, prog="xalign cache")


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
  """(the `xalign cache` flags with `num_shards`, the Beam pipeline options with --runner)."""
  from flax_xalign.data.packed import beam as packed_beam

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
  packed_beam.require_beam()  # Beam's own flags are told apart by Beam.
  beam_flags, job_flags = packed_beam.split_flags(rest)
  args = cache_flags.parse_flags(job_flags, prog="xalign cache", description=cache_flags.DESCRIPTION,
                               gin_flags=_gin_flags)
  if args.workers != 1:
    raise UserError(f"--workers={args.workers} is `xalign cache`'s flag; here --num_shards=N sets the shards Beam's "
                    "workers write.")
  args.num_shards = ours.num_shards
  if not any(flag.startswith(HARNESS_LOG_LEVEL) for flag in beam_flags):
    beam_flags.append(f"{HARNESS_LOG_LEVEL}=WARNING")  # Worker processes would log every gRPC channel at INFO.
  return args, [f"--runner={ours.runner}", *beam_flags]


def _fill_from_gin(gin_args: Any, job: cache_job.CacheJob) -> cache_job.CacheJob:
  """Registers the gin run's user tasks and takes its settings for every flag left unset."""
  from flax_xalign.cli import gin_cli

  return cache_job.fill_from_bindings(job, gin_cli.train_bindings(gin_args))


def run(parsed: tuple[argparse.Namespace, list[str]]) -> Any:
  """Builds and runs the pipeline; returns the finished `PipelineResult`."""
  from flax_xalign.cli._process import setup_process

  args, beam_flags = parsed
  fill = functools.partial(_fill_from_gin, args.gin) if args.gin is not None else None
  return cache_job.write_cache_beam(cache_flags.job_of(args), beam_flags, num_shards=args.num_shards, fill=fill,
                                    worker_setup=setup_process)


def main(argv: Sequence[str] | None = None) -> int:
  return common.main_of(parse_args, run, argv)


if __name__ == "__main__":
  sys.exit(main())
