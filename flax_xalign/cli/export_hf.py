r"""Exports a MODEL_DIR as a Hugging Face BERT or XLM-R directory (the library: `flax_xalign.interop.export_hf`).

  xalign export_hf --model_dir=MODEL_DIR --output=DIR --layout=bert|xlmr

(`python -m flax_xalign.cli.export_hf` is the same command; `--checkpoint` is
still accepted for `--model_dir`.) The library module's docstring says what
is written.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from flax_xalign.cli import common
from flax_xalign.errors import ArgumentParser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  from flax_xalign.interop import export_hf

  parser = ArgumentParser(prog="xalign export_hf",
                          description=export_hf.__doc__.strip().splitlines()[0])
  common.add_model_dir_flag(parser, help="MODEL_DIR (trained or imported)")
  parser.add_argument("--output", required=True, help="the new Hugging Face directory")
  parser.add_argument("--layout", required=True, choices=("bert", "xlmr"),
                      help="bert: BertForMaskedLM (positions from 0); xlmr: XLMRobertaForMaskedLM")
  return parser.parse_args(argv)


def run(args: argparse.Namespace) -> dict:
  from flax_xalign.fileio import check_output_folder
  from flax_xalign.interop.export_hf import export_hf

  common.existing_model_dir(args.model_dir)  # "does not exist", not the library's "holds no checkpoint".
  common.check_outside_run(args.output, args.model_dir)
  check_output_folder(args.output, inputs={"--model_dir": args.model_dir}, inside_ok=("--model_dir",))
  return export_hf(args.model_dir, args.output, layout=args.layout)


def main(argv: Sequence[str] | None = None) -> int:
  return common.main_of(parse_args, run, argv)


if __name__ == "__main__":
  sys.exit(main())
