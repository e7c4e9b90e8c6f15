r"""Imports a Hugging Face BERT or XLM-R directory as a MODEL_DIR (the library: `flax_xalign.interop.import_hf`).

  xalign import_hf --source=DIR --output=MODEL_DIR \
      [--languages=grc,en] [--language_pair=grc,en] [--trim_vocab_to=TASK]

(`python -m flax_xalign.cli.import_hf` is the same command.) The library
module's docstring says what is read and written.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from flax_xalign.cli import common
from flax_xalign.errors import ArgumentParser, UserError


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  from flax_xalign.interop import import_hf

  parser = ArgumentParser(prog="xalign import_hf",
                          description=import_hf.__doc__.strip().splitlines()[0])
  parser.add_argument("--source", required=True, help="Hugging Face model directory (save_pretrained output)")
  parser.add_argument("--output", required=True, help="the new MODEL_DIR")
  parser.add_argument("--languages", default="", help="comma-separated language codes, e.g. grc,en")
  parser.add_argument("--language_pair", default="", help="the aligner's default source,target, e.g. grc,en")
  parser.add_argument("--seed", type=int, default=0, help="seeds parameters the checkpoint lacks (MLM head)")
  parser.add_argument("--vocab_pad_multiple", type=int, default=1,
                      help="pad the embedding rows to a multiple of this (e.g. 128, for a sharded 'vocab' axis)")
  parser.add_argument("--trim_vocab_to", default=None,
                      help="keep only the vocabulary pieces this task's text uses (unigram SentencePiece)")
  parser.add_argument("--trim_normalize", default="",
                      help="with --trim_vocab_to: also keep pieces of the text under these normalisers, e.g. "
                           "nfd_strip_marks")
  return parser.parse_args(argv)


def _codes(text: str, flag: str) -> list[str]:
  codes = [c.strip() for c in text.split(",") if c.strip()]
  if len(set(codes)) != len(codes) or any(not c.replace("_", "").replace("-", "").isalnum() for c in codes):
    raise UserError(f"{flag} must be distinct language codes separated by commas (e.g. grc,en); got {text!r}.")
  return codes


def run(args: argparse.Namespace) -> None:
  from flax_xalign.fileio import check_output_folder
  from flax_xalign.interop.import_hf import import_hf
  from flax_xalign.interop.trim import import_maybe_trimmed

  from flax_xalign import storage

  storage.check_local(args.source, setting="--source", reason="a Hugging Face folder is read by libraries that "
                      "open its files by name")
  check_output_folder(args.output, inputs={"--source": args.source})
  languages = _codes(args.languages, "--languages")
  pair = _codes(args.language_pair, "--language_pair")
  if pair and len(pair) != 2:
    raise UserError(f"--language_pair takes two codes, source,target; got {args.language_pair!r}.")
  if not pair and len(languages) == 2:
    pair = languages
  languages = sorted(set(languages) | set(pair))

  def write(output: str) -> None:
    import_hf(args.source, output, languages=languages, language_pairs=[tuple(pair)] if pair else [],
              seed=args.seed, vocab_pad_multiple=args.vocab_pad_multiple)

  import_maybe_trimmed(write, args.output, trim_vocab_to=args.trim_vocab_to, trim_normalize=args.trim_normalize)


def main(argv: Sequence[str] | None = None) -> int:
  return common.main_of(parse_args, run, argv)


if __name__ == "__main__":
  sys.exit(main())
