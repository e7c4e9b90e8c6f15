"""Builds the Greek->English MUSE lexicon from the manual alignments (the library: `flax_xalign.data.sources.lexicon`).

  xalign lexicon --output=grc-en.train.txt [--min_count=2] [--split=train]

(`python -m flax_xalign.cli.lexicon` is the same command.)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from flax_xalign.cli import common
from flax_xalign.errors import ArgumentParser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  from flax_xalign.data.sources import bible
  from flax_xalign.data.sources import lexicon
  parser = ArgumentParser(prog="xalign lexicon",
                          description="Builds the Greek->English MUSE lexicon from the manual alignments.")
  parser.add_argument("--output", required=True, help="MUSE file to write (source target per line)")
  parser.add_argument("--min_count", type=int, default=lexicon.MIN_COUNT, help="smallest best link count kept")
  parser.add_argument("--split", choices=bible.SPLITS, default="train",
                      help="books whose alignments are counted (the shipped lexicon: train)")
  return parser.parse_args(argv)


def run(args: argparse.Namespace) -> None:
  from flax_xalign.data.sources import lexicon
  from flax_xalign.fileio import check_output_file, write_atomically

  check_output_file(args.output)
  rows = lexicon.greek_english_lexicon(args.split, min_count=args.min_count)
  write_atomically(args.output, lexicon.format_lexicon(rows))
  print(f"wrote {args.output}: {len(rows)} Greek words ({args.split} books, min_count {args.min_count})")


def main(argv: Sequence[str] | None = None) -> int:
  return common.main_of(parse_args, run, argv)


if __name__ == "__main__":
  sys.exit(main())
