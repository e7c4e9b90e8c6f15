r"""Counts the global co-occurrence table of MLM-GC (Ai & Fang 2023, §3.2), or shows what a table holds.

  xalign cooc --task=NAME --window=2 --output=DIR [--split=train] \
      [--languages=de,en] [--reference_language=en] [--drop_diagonal]
  xalign cooc --text=FILE:LANG [--text=FILE:LANG ...] --vocabulary=MODEL --output=DIR [--window=2]
  xalign cooc --inspect=DIR --token=PIECE_OR_ID [--top=10] [--vocabulary=MODEL]

Counting reads the split of a registered seqio task or mixture (every member
once, unpacked) or UTF-8 text files (one sentence per line, tokenised with a
SentencePiece model), prints a progress line with tokens/s every few seconds
and a summary, and writes `DIR/cooc.npz` (the CSR table, pre-logged) and
`DIR/cooc.json` (the manifest: window, weights, c_lang, tokens per language,
corpus fingerprint, source). Definitions: `flax_xalign.data.cooc`. Use the
directory as a run's table with `train.asset_options = {'cooc': {'path': DIR}}`.

--inspect prints the `--top` largest X[token, b] of a token, with pieces when
the vocabulary is known (the counted task's, the --text run's model, or
--vocabulary); a numeric --token is an id and works without one. The work:
`flax_xalign.training.cooc_job` (the job's options: `flax_xalign.data.cooc.job`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from flax_xalign.cli import common
from flax_xalign.errors import ArgumentParser


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = ArgumentParser(prog="xalign cooc", description=__doc__.split("\n")[0])
  parser.add_argument("--task", help="a registered seqio task or mixture to count")
  parser.add_argument("--text", action="append", default=[], metavar="FILE:LANG",
                      help="a text file (one sentence per line) and its language code; repeatable")
  parser.add_argument("--vocabulary", help="SentencePiece model for --text (and pieces for --inspect)")
  parser.add_argument("--split", default="train")
  parser.add_argument("--languages", help="comma-separated codes to count (default: the task's)")
  parser.add_argument("--window", type=int, default=2, help="n of the ±n window (the paper: 2)")
  parser.add_argument("--reference_language", default="en", help="c_lang = C_ref / C_lang")
  parser.add_argument("--drop_diagonal", action="store_true", help="leave out X[a, a]")
  parser.add_argument("--output", help="directory for cooc.npz and cooc.json")
  parser.add_argument("--inspect", metavar="DIR", help="a directory with a table to inspect")
  parser.add_argument("--token", help="with --inspect: a piece or an id")
  parser.add_argument("--top", type=int, default=10)
  return parser.parse_args(argv)


def job_of(args: argparse.Namespace):
  """The `CoocJob` of the counting flags."""
  from flax_xalign.data.cooc.job import CoocJob

  languages = tuple(c for c in args.languages.split(",") if c) if args.languages else None
  return CoocJob(output=args.output, task=args.task, texts=tuple(args.text), vocabulary=args.vocabulary,
                 split=args.split, languages=languages, window=args.window,
                 reference_language=args.reference_language, drop_diagonal=args.drop_diagonal)


def run(args: argparse.Namespace) -> None:
  from flax_xalign.training import cooc_job

  if args.inspect:
    cooc_job.inspect(args.inspect, args.token, top=args.top, vocabulary=args.vocabulary)
  else:
    cooc_job.count(job_of(args))


def main(argv: Sequence[str] | None = None) -> int:
  return common.main_of(parse_args, run, argv)


if __name__ == "__main__":
  sys.exit(main())
