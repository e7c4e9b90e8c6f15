r"""Trims a MODEL_DIR's vocabulary to the pieces a task's text uses (the library: `flax_xalign.interop.trim`).

  xalign trim --model_dir=runs/e5 --task=bible_grc_en_mlm_tlm \
      --output=runs/e5_bible [--splits=train,validation,test] [--normalize=nfd_strip_marks]

Prints the summary as one JSON object. (`python -m flax_xalign.cli.trim` is
the same command; `--checkpoint` is still accepted for `--model_dir`.) The
library module's docstring says what is kept and checked.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from flax_xalign.cli import common
from flax_xalign.errors import ArgumentParser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  from flax_xalign.interop import trim

  parser = ArgumentParser(prog="xalign trim", description=trim.__doc__.splitlines()[0])
  common.add_model_dir_flag(parser, help="MODEL_DIR to trim (an import or a training run)")
  parser.add_argument("--task", required=True, help="registered task or mixture whose text decides what stays")
  parser.add_argument("--output", required=True, help="new MODEL_DIR")
  parser.add_argument("--splits", default=",".join(trim._SPLITS), help="comma-separated splits to read")
  parser.add_argument("--normalize", default="",
                      help="also keep the pieces of the text under these normalisers (comma-separated, e.g. "
                           "nfd_strip_marks when aligning with --normalize=nfd_strip_marks)")
  return parser.parse_args(argv)


def run(args: argparse.Namespace) -> dict:
  from flax_xalign.fileio import check_output_folder
  from flax_xalign.interop.trim import trim_model_dir

  common.check_outside_run(args.output, args.model_dir)
  check_output_folder(args.output, inputs={"--model_dir": args.model_dir}, inside_ok=("--model_dir",))
  summary = trim_model_dir(args.model_dir, args.task, args.output, splits=tuple(args.splits.split(",")),
                           normalizers=tuple(n for n in args.normalize.split(",") if n))
  print(json.dumps(summary))
  return summary


def main(argv: Sequence[str] | None = None) -> int:
  return common.main_of(parse_args, run, argv)


if __name__ == "__main__":
  sys.exit(main())
