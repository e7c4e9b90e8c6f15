r"""Trains a SentencePiece model with flax_xalign's special ids (the library: `flax_xalign.data.vocab.sentencepiece`).

  xalign vocab --input=a.txt --input=b.txt \
      --vocab_size=8000 --output=/path/to/prefix   # writes prefix.model
                                                   # (--output=prefix.model writes the same file)

(`python -m flax_xalign.cli.vocab` is the same command.) One sentence per line
in each input file.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from flax_xalign.cli import common
from flax_xalign.errors import ArgumentParser, UserError


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  # The library module imports seqio (and TensorFlow): `run` imports it, so flag errors answer at once.
  parser = ArgumentParser(
      prog="xalign vocab",
      description="Train a SentencePiece model with flax_xalign's special ids.")
  parser.add_argument("--input", action="append", required=True,
                      help="text file, one sentence per line (repeatable)")
  parser.add_argument("--vocab_size", type=int, required=True)
  parser.add_argument("--output", required=True,
                      help="output prefix; writes PREFIX.model (a PREFIX ending in .model is the file itself)")
  parser.add_argument("--model_type", default="unigram",
                      choices=("unigram", "bpe", "char", "word"))
  parser.add_argument("--character_coverage", type=float, default=0.9995)
  parser.add_argument("--input_sentence_size", type=int, default=1_000_000)
  parser.add_argument("--seed", type=int, default=None)  # None: the library's DEFAULT_SEED (`run`).
  args = parser.parse_args(argv)
  args.output = model_prefix(args.output)
  return args


def model_prefix(output: str) -> str:
  """The prefix of --output: `x.model` is taken as the file to write (x.model), never as the prefix of x.model.model."""
  prefix = output.removesuffix(".model")
  return prefix if os.path.basename(prefix) else output


def _read_lines(files: Sequence[str]) -> list[str]:
  lines = []
  for name in files:
    if not os.path.isfile(name):
      raise UserError(
          f"--input file {name} does not exist; pass existing text files, one "
          "sentence per line.")
    with open(name, encoding="utf-8") as f:
      lines.extend(line.rstrip("\n") for line in f)
  return lines


def run(args: argparse.Namespace) -> str:
  from flax_xalign import fileio

  fileio.check_output_file(args.output + ".model", inputs={"--input": args.input})
  for name in args.input:
    fileio.check_input_file(name, setting="--input file")
  lines = _read_lines(args.input)
  from flax_xalign.data.vocab import sentencepiece as vocab

  path = vocab.train_sentencepiece(
      lines, vocab_size=args.vocab_size,
      model_path=args.output + ".model", model_type=args.model_type,
      character_coverage=args.character_coverage,
      seed=vocab.DEFAULT_SEED if args.seed is None else args.seed,
      input_sentence_size=args.input_sentence_size)
  print(f"wrote {path}")
  return path


def main(argv: Sequence[str] | None = None) -> int:
  """Command-line entry point; returns the exit status."""
  return common.main_of(parse_args, run, argv)


if __name__ == "__main__":
  sys.exit(main())
