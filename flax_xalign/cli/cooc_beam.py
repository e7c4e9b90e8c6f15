r"""The command of the Beam co-occurrence pipeline (the pipeline itself: `flax_xalign.data.cooc.beam`).

  xalign cooc_beam --task=NAME --output=DIR [--window=2] [--split=train] \
      [--languages=de,en] [--reference_language=en] [--drop_diagonal] [--shards=16] [--buckets=64] \
      [--runner=DirectRunner|DataflowRunner|FlinkRunner|SparkRunner ...other Beam pipeline options]
  xalign cooc_beam --text=FILE:LANG [--text=FILE:LANG ...] --vocabulary=MODEL --output=DIR ...

(`python -m flax_xalign.cli.cooc_beam` is the same command.) Flags it does not
know are Beam pipeline options, passed through. The work is
`flax_xalign.training.cooc_beam_job`; the pipeline's functions are used from
`flax_xalign.data.cooc.beam`, imported by name, so Beam pickles them under a
module its workers can import; it is imported inside the functions, after the
process set-up, since it brings in TensorFlow.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from flax_xalign.cli import common
from flax_xalign.errors import ArgumentParser


PIPELINE_MODULE = "flax_xalign.data.cooc.beam"


def _pipeline_summary() -> str:
  """The first line of the pipeline module's docstring, read from its source without importing it."""
  import ast
  import importlib.util

  with open(importlib.util.find_spec(PIPELINE_MODULE).origin, encoding="utf-8") as f:
    return (ast.get_docstring(ast.parse(f.read())) or "").split("\n")[0]


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
  """(our flags, the rest: Beam pipeline options such as --runner, passed through).

  --shards, --lines_per_shard and --buckets are None when not given (the job's `check` fills in the defaults:
  the pipeline module brings in TensorFlow, so it is imported once the cheap checks have passed).
  """
  from flax_xalign.data import cooc
  parser = ArgumentParser(prog="xalign cooc_beam", allow_abbrev=False,
                          description=_pipeline_summary())
  parser.add_argument("--task", help="a registered seqio task or mixture to count")
  parser.add_argument("--text", action="append", default=[], metavar="FILE:LANG",
                      help="a text file (one sentence per line) and its language code; repeatable")
  parser.add_argument("--vocabulary", help="SentencePiece model for --text")
  parser.add_argument("--split", default="train")
  parser.add_argument("--languages", help="comma-separated codes to count (default: the task's)")
  parser.add_argument("--window", type=int, default=cooc.DEFAULT_WINDOW,
                      help="n of the ±n window (the paper: 2)")
  parser.add_argument("--reference_language", default=cooc.DEFAULT_REFERENCE_LANGUAGE)
  parser.add_argument("--drop_diagonal", action="store_true", help="leave out X[a, a]")
  parser.add_argument("--output", help="directory for cooc.npz and cooc.json (local or gs://, s3://, ...)")
  parser.add_argument("--shards", type=int, default=None, help="shards per member task")
  parser.add_argument("--lines_per_shard", type=int, default=None, help="text lines per shard")
  parser.add_argument("--buckets", type=int, default=None, help="merge keys: row token a mod buckets")
  return parser.parse_known_args(argv)


def job_of(args: argparse.Namespace):
  """The `BeamCoocJob` of our flags."""
  from flax_xalign.data.cooc.job import CoocJob
  from flax_xalign.training.cooc_beam_job import BeamCoocJob

  languages = tuple(c for c in args.languages.split(",") if c) if args.languages else None
  count = CoocJob(output=args.output, task=args.task, texts=tuple(args.text), vocabulary=args.vocabulary,
                  split=args.split, languages=languages, window=args.window,
                  reference_language=args.reference_language, drop_diagonal=args.drop_diagonal)
  return BeamCoocJob(count=count, shards=args.shards, lines_per_shard=args.lines_per_shard, buckets=args.buckets)


def run(argv: Sequence[str] | None = None) -> Any:
  """Builds and runs the pipeline of a command line; returns the finished `PipelineResult`."""
  from flax_xalign.training import cooc_beam_job

  args, beam_args = parse_args(argv)
  return cooc_beam_job.run(job_of(args), beam_args)


def main(argv: Sequence[str] | None = None) -> int:
  return common.main_of(lambda flags: flags, run, argv)


if __name__ == "__main__":
  sys.exit(main())
