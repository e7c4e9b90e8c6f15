r"""Word links from eflomal, written beside the bitext they align: labels for DWA / SO to learn from.

  xalign eflomal --input=pairs.tsv --output=pairs.links [--symmetrize=grow-diag-final-and]
  xalign eflomal --bible --output_dir=data/bible_links [--symmetrize=...]

--input: `source words<TAB>target words` per line; every line is aligned
(unsupervised, all at once, as users run eflomal) and --output gets one
Pharaoh line per input line, `i-j` over the whitespace-separated words.

--bible: the embedded Greek-English New Testament. eflomal aligns all 7,919
verse pairs (every book, as users run it), and for each split the command
writes `<split>.tsv` (Greek words<TAB>English words, the word lists the gold
alignments index) and `<split>.links`, so a `TsvBitextTask` can train on the
train books with eflomal's links and be tuned on the validation books:

  TsvBitextTask(name='bible_linked', files={'train': 'DIR/train.tsv', 'validation': 'DIR/validation.tsv'},
                lang_a='grc', lang_b='en', vocabulary_path=..., normalize='nfd_strip_marks',
                links={'train': 'DIR/train.links'})

(gin_configs/experiments/e5_so_eflomal.gin). The held-out test books' text
is part of eflomal's unsupervised corpus, as it is when eflomal is scored;
their links are written but no task should train on them.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from flax_xalign.cli import common
from flax_xalign.errors import ArgumentParser


def parse_args(argv: Sequence[str]):
  from flax_xalign.evaluation.word_alignment import statistical

  parser = ArgumentParser(prog="xalign eflomal", description=__doc__.splitlines()[0])
  parser.add_argument("--input", default=None, help="TSV bitext, source<TAB>target words per line")
  parser.add_argument("--output", default=None, help="Pharaoh file for --input (one line per pair)")
  parser.add_argument("--bible", action="store_true", help="align the embedded Greek-English New Testament")
  parser.add_argument("--output_dir", default=None, help="with --bible: where <split>.tsv and <split>.links go")
  parser.add_argument("--symmetrize", default="grow-diag-final-and", choices=statistical.SYMMETRISATIONS + (
      "forward", "reverse"), help="how the two directions are combined (default grow-diag-final-and)")
  args = parser.parse_args(argv)
  if args.bible == bool(args.input):
    parser.error("pass either --input=FILE (with --output) or --bible (with --output_dir)")
  if args.input and not args.output:
    parser.error("--input needs --output=FILE.links")
  if args.bible and not args.output_dir:
    parser.error("--bible needs --output_dir=DIR")
  return args


def run(args) -> None:
  from flax_xalign import fileio
  from flax_xalign.evaluation.word_alignment import aer, statistical
  from flax_xalign.evaluation.word_alignment.bible_links import check_output_dir, combine, write_bible_links

  if args.input:
    fileio.check_output_file(args.output, inputs={"--input": args.input})
    fileio.check_input_file(args.input, setting="--input")
    pairs = aer.read_pairs(args.input, setting="--input")
    print(f"eflomal: aligning {len(pairs)} pairs of {args.input} ...", flush=True)
    result = statistical.run_eflomal(pairs)
    statistical.write_links(args.output, combine(result, args.symmetrize))
    print(f"wrote {args.output}: {args.symmetrize}, {len(pairs)} lines ({result.seconds:.1f} s)")
    return
  from flax_xalign import storage

  storage.check_local(args.output_dir, setting="--output_dir", reason="the Bible's splits and links are written "
                      "as local files, marked and locked (eflomal reads local files)")
  check_output_dir(args.output_dir)
  result, _ = write_bible_links(args.output_dir, symmetrize=args.symmetrize, verbose=True)
  print(f"eflomal {result.version}, {args.symmetrize}, {result.seconds:.1f} s")


def main(argv: Sequence[str] | None = None) -> int:
  return common.main_of(parse_args, run, argv)


if __name__ == "__main__":
  sys.exit(main())
