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

import os
import sys
from collections.abc import Sequence

from flax_xalign.cli import common
from flax_xalign.errors import ArgumentParser

# The mark (`fileio.write_mark`) of a folder --bible created: only such a folder is written into again.
BIBLE_COMMAND = "xalign eflomal --bible"


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


def _combine(result, method: str) -> list:
  from flax_xalign.evaluation.word_alignment import statistical

  if method in ("forward", "reverse"):
    return list(getattr(result, method))
  return statistical.symmetrise(result.forward, result.reverse, method)


def run(args) -> None:
  from flax_xalign.cli import align as align_cli
  from flax_xalign.evaluation.word_alignment import statistical

  from flax_xalign import fileio
  from flax_xalign.data.sources import bible

  if args.input:
    fileio.check_output_file(args.output, inputs={"--input": args.input})
    fileio.check_input_file(args.input, setting="--input")
    pairs = align_cli.read_pairs(args.input)
    print(f"eflomal: aligning {len(pairs)} pairs of {args.input} ...", flush=True)
    result = statistical.run_eflomal(pairs)
    statistical.write_links(args.output, _combine(result, args.symmetrize))
    print(f"wrote {args.output}: {args.symmetrize}, {len(pairs)} lines ({result.seconds:.1f} s)")
    return
  from flax_xalign import storage

  storage.check_local(args.output_dir, setting="--output_dir", reason="the Bible's splits and links are written "
                      "as local files, marked and locked (eflomal reads local files)")
  own = {f"{split}.{ext}" for split in bible.SPLITS for ext in ("tsv", "links")} | {"NOTICE", fileio.MARK}

  def owned(folder: str) -> bool:  # The names alone prove nothing: a user's own train.tsv looks the same.
    mark = fileio.read_mark(folder)
    return bool(mark) and mark["command"] == BIBLE_COMMAND and set(os.listdir(folder)) <= own

  fileio.check_output_folder(args.output_dir, setting="--output_dir", owned=owned,
                             what=f"an earlier --bible output (marked by {BIBLE_COMMAND}, {fileio.MARK})")
  result, _ = bible_links(args.output_dir, symmetrize=args.symmetrize, verbose=True)
  print(f"eflomal {result.version}, {args.symmetrize}, {result.seconds:.1f} s")


def bible_links(output_dir: str, *, symmetrize: str = "grow-diag-final-and", verbose: bool = False):
  """eflomal over every New Testament verse pair; `<split>.tsv` + `<split>.links` per split into `output_dir`.

  Returns (the `statistical.EflomalResult` over all pairs, {split: indices of its pairs in that result}).
  A folder it creates (or finds empty) is marked as --bible's, so a rerun may write into it again.
  """
  from flax_xalign import fileio
  from flax_xalign.data.sources import bible
  from flax_xalign.evaluation.word_alignment import aer
  from flax_xalign.evaluation.word_alignment import statistical

  pairs, _, _ = statistical.bible_corpus("test")
  splits = {split: statistical.bible_corpus(split)[1] for split in bible.SPLITS}
  if verbose:
    print(f"eflomal: aligning all {len(pairs)} New Testament verse pairs ...", flush=True)
  result = statistical.run_eflomal(pairs)
  links = _combine(result, symmetrize)
  fileio.mark_new_folder(output_dir, BIBLE_COMMAND, setting="--output_dir")
  written = []
  for split, indices in splits.items():
    tsv = os.path.join(output_dir, f"{split}.tsv")
    aer.write_atomically(tsv, "".join(f"{' '.join(pairs[k][0])}\t{' '.join(pairs[k][1])}\n" for k in indices))
    statistical.write_links(os.path.join(output_dir, f"{split}.links"), [links[k] for k in indices])
    written += [f"{split}.tsv", f"{split}.links"]
    if verbose:
      print(f"wrote {tsv} and {split}.links ({len(indices)} pairs)", flush=True)
  aer.write_atomically(os.path.join(output_dir, "NOTICE"), bible.LICENSE_NOTICE)
  mark = fileio.read_mark(output_dir)
  if mark and mark["command"] == BIBLE_COMMAND:
    fileio.write_mark(output_dir, BIBLE_COMMAND, [*written, "NOTICE"])
  return result, splits


def main(argv: Sequence[str] | None = None) -> int:
  return common.main_of(parse_args, run, argv)


if __name__ == "__main__":
  sys.exit(main())
