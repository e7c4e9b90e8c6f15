r"""Sentence retrieval accuracy of a checkpoint per layer (Tatoeba style, as XTREME / XLM-Align).

  xalign retrieval --model_dir=MODEL_DIR (--tsv=FILE | --bible=validation|test) \
      [--src_lang=grc --tgt_lang=en] [--layers=all|0,4,8] [--method=cosine,csls] [--csls_k=10] \
      [--max_pairs=N] [--normalize=nfd_strip_marks] [--max_length=128] [--batch_size=32] [--output=FILE.json]

--tsv is `source<TAB>target` per line (UTF-8; blank lines skipped), line i of
one side the translation of line i of the other. --bible takes the verse pairs
of the embedded Greek-English Bible's held-out books (`data.bible.bitext`:
validation 708 verses, test 885), offline once the corpus is cached; Greek is
the source. Each sentence is the mean of its token states at a layer (0 = the
embedding output), its nearest neighbour on the other side is retrieved by
cosine or CSLS (K = --csls_k), and the accuracy is reported both ways per
layer, with the best layer per method. Identical sentences on one side count
as one: retrieving the other copy is correct (`evaluation.retrieval`).

Reference points in the same run: the bag-of-pieces baseline (piece-count
vectors, cosine and CSLS; no model) and chance (1 / pairs). The model's
language ids come from --src_lang / --tgt_lang (default: the run's language
pair; the Bible's grc, en); models without language embeddings accept any code.
Text is normalised with --normalize before tokenising; use what the model's
training text went through (nfd_strip_marks for the Bible runs and their
multilingual-e5 imports). The last printed line is a JSON object (also written
to --output).

The work is `evaluation.retrieval.evaluate_retrieval` (also the `retrieval`
evaluator of `python -m flax_xalign.eval`); `python -m flax_xalign.cli.retrieval`
is the same command. `--checkpoint` is still accepted for `--model_dir`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from flax_xalign import fileio
from flax_xalign.cli import common
from flax_xalign.errors import ArgumentParser
from flax_xalign.evaluation.retrieval import BIBLE_SPLITS, RetrievalOptions, read_pairs  # noqa: F401


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  from flax_xalign.data.vocab import normalize
  from flax_xalign.evaluation import retrieval

  parser = ArgumentParser(prog="xalign retrieval", description=__doc__.splitlines()[0])
  common.add_model_dir_flag(parser, help="MODEL_DIR (trained or imported)")
  parser.add_argument("--tsv", default=None, help="source<TAB>target sentence pairs, one per line")
  parser.add_argument("--bible", choices=BIBLE_SPLITS, default=None,
                      help="held-out Greek-English Bible verses instead of --tsv")
  parser.add_argument("--src_lang", default=None, help="language code of the source side")
  parser.add_argument("--tgt_lang", default=None, help="language code of the target side")
  parser.add_argument("--layers", default="all", help="'all' or comma-separated layers (0 = embedding output)")
  parser.add_argument("--method", default=",".join(retrieval.METHODS),
                      help=f"comma-separated subset of {','.join(retrieval.METHODS)}")
  parser.add_argument("--csls_k", type=int, default=retrieval.DEFAULT_CSLS_K, help="K of CSLS")
  parser.add_argument("--max_pairs", type=int, default=None, help="use the first N pairs")
  parser.add_argument("--normalize", choices=normalize.NORMALIZERS, default="",
                      help="text normaliser applied before tokenising")
  parser.add_argument("--max_length", type=int, default=128, help="tokens per sentence, <s> and </s> included")
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--output", default=None, help="also write the JSON result here")
  return parser.parse_args(argv)


def options_of(args: argparse.Namespace) -> RetrievalOptions:
  """The evaluation's options: every flag but the run directory."""
  return RetrievalOptions(**{k: v for k, v in vars(args).items() if k != "model_dir"})


def run(args: argparse.Namespace) -> dict:
  """Runs the command on parsed `args`; returns the JSON object it prints last."""
  from flax_xalign.evaluation.retrieval import evaluate_retrieval
  from flax_xalign.runs import Run

  options = options_of(args).check()  # Bad flags are reported before the run is read.
  if args.output is not None:
    common.check_outside_run(args.output, args.model_dir)
    fileio.check_output_file(args.output, inputs={"--tsv": args.tsv})
  if args.tsv:
    fileio.check_input_file(args.tsv, setting="--tsv")
  result = evaluate_retrieval(Run.open(common.existing_model_dir(args.model_dir)), options,
                              log=lambda line: print(line, flush=True))
  print(json.dumps(result), flush=True)
  return result


def main(argv: Sequence[str] | None = None) -> int:
  return common.main_of(parse_args, run, argv)


if __name__ == "__main__":
  sys.exit(main())
