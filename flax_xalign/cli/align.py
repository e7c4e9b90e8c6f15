r"""Word alignment with a pretrained checkpoint (SimAlign / XLM-Align style).

  xalign align --model_dir=runs/demo --input=pairs.tsv --output=out.txt \
      [--layer=3] [--method=argmax|itermax|sinkhorn|sinkhorn_itermax|softmax|match] \
      [--src_lang=grc --tgt_lang=en] [--similarity=dot] \
      [--normalize=nfd_strip_marks] [--encoding=joint|separate] [--pair_layout=restart|continuous] \
      [--sinkhorn_kernel=clamped|entropic --sinkhorn_order=rows_first|columns_first \
       --sinkhorn_extraction=plan|pi_xi --mu=1.0 --[no-]relative_mu --sinkhorn_iters=2 \
       --itermax_alpha=0.9 --itermax_rounds=2 --softmax_threshold=1e-3] \
      [--gold=gold.txt --gold_format=pharaoh|naacl [--sweep]]
  xalign align --model_dir=runs/e5 --bible_gold=test --output=runs/e5/aer/links.txt --sweep

Input: one sentence pair per line, `source<TAB>target`, words separated by
spaces. Output: one Pharaoh line per pair, `i-j` links (0-indexed, source word
i - target word j), written atomically. The languages default to the sides of
the checkpoint's bitext task; the layer to 2/3 of the depth (XLM-Align's 8 of
12). With --gold, also prints P/R/F1/AER; with --sweep, scores every layer
with argmax, itermax and sinkhorn (and --method, e.g. sinkhorn_itermax, the
paper's §3.1 Sinkhorn + Itermax) against --gold, prints the table, writes
<output>_layers.png beside --output and writes the alignments of the best
(method, layer) unless --layer/--method pin one. --normalize normalises every
word before tokenising it (e.g. nfd_strip_marks drops polytonic Greek's
diacritics); word indices refer to the input words either way.
--encoding=separate encodes each side as if alone (SimAlign's way; best for
sentence encoders such as multilingual-e5), joint (XLM-Align's) encodes the
pair in one attention segment.

Unset, --encoding, --similarity and --normalize follow the model, and the
command prints what it chose and why: a model trained with DWA aligns as DWA
self-labelled, one trained with TLM joint with dot products, anything else
(e.g. an imported sentence encoder) separate with cosine; the normaliser is
the one its training tasks or its trimmed vocabulary used (run manifest,
origin.json, followed through the run it was warm-started from).
--pair_layout defaults to the layout the checkpoint was trained with (run
manifest). The solver flags are `ops.AlignmentSolver`'s fields, with the
paper's defaults (kernel max(eps, S)^(1/mu), rows first, mu 1, 2 iterations,
links from the plan); the released XLM-Align aligner is
--sinkhorn_order=columns_first --sinkhorn_extraction=pi_xi.

`python -m flax_xalign.cli.align` is the same command; `--checkpoint` is still
accepted for `--model_dir`. The work is `flax_xalign.evaluation.word_alignment.align_job`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence

from flax_xalign.cli import common
from flax_xalign.errors import ArgumentParser


def _solver_flags(parser: argparse.ArgumentParser) -> None:
  """One flag per AlignmentSolver field, defaulting to the field's default."""
  from flax_xalign import ops
  from flax_xalign.evaluation.word_alignment import word_align
  defaults = {f.name: f.default for f in dataclasses.fields(ops.AlignmentSolver)}
  choices = {"similarity": word_align.SIMILARITIES, "sinkhorn_kernel": word_align.SINKHORN_KERNELS,
             "sinkhorn_order": word_align.SINKHORN_ORDERS,
             "sinkhorn_extraction": word_align.SINKHORN_EXTRACTIONS}
  for name, values in choices.items():
    # similarity=None: follow the model (model_defaults); the others default to the paper's values.
    parser.add_argument(f"--{name}", choices=values, default=None if name == "similarity" else defaults[name])
  for name in ("mu", "clamp_epsilon", "itermax_alpha", "softmax_threshold"):
    parser.add_argument(f"--{name}", type=float, default=defaults[name])
  for name in ("sinkhorn_iters", "itermax_rounds"):
    parser.add_argument(f"--{name}", type=int, default=defaults[name])
  parser.add_argument("--relative_mu", action=argparse.BooleanOptionalAction, default=defaults["relative_mu"],
                      help="entropic kernel: temperature mu * mean |S| (default) or mu itself")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  from flax_xalign.data.vocab import normalize
  from flax_xalign.data.vocab.specials import PAIR_LAYOUTS
  from flax_xalign.evaluation.word_alignment import aer
  from flax_xalign.evaluation.word_alignment import word_align
  parser = ArgumentParser(prog="xalign align", description=__doc__.splitlines()[0])
  common.add_model_dir_flag(parser, help="MODEL_DIR written by python -m flax_xalign.train")
  parser.add_argument("--input", default=None, help="TSV file: source<TAB>target per line")
  parser.add_argument("--bible_gold", default=None, choices=("train", "validation", "test"),
                      help="instead of --input/--gold: the embedded Greek-English verses of this split and their "
                           "manual gold (written as files beside --output)")
  parser.add_argument("--output", required=True, help="Pharaoh output file (i-j per link)")
  parser.add_argument("--layer", type=int, default=None, help="hidden layer (0 = embeddings)")
  parser.add_argument("--method", choices=word_align.METHODS, default=None,
                      help="default: sinkhorn; sinkhorn_itermax is the paper's §3.1 (DWA's self-labels); "
                           "--sweep scores argmax, itermax, sinkhorn and this one")
  parser.add_argument("--src_lang", default=None)
  parser.add_argument("--tgt_lang", default=None)
  _solver_flags(parser)
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--max_length", type=int, default=256, help="positions per pair (both sides + 4)")
  parser.add_argument("--vocabulary", default=None, help="SentencePiece model, if the task is not known here")
  parser.add_argument("--normalize", choices=normalize.NORMALIZERS, default=None,
                      help="text normaliser applied to each word before tokenising (default: the one the model's "
                           "training text or trimmed vocabulary went through, else none)")
  parser.add_argument("--encoding", choices=word_align.ENCODINGS, default=None,
                      help="joint: one attention segment per pair (XLM-Align); separate: each side alone "
                           "(SimAlign). Default: joint if the model was trained on pairs (TLM/DWA), else separate")
  parser.add_argument("--pair_layout", choices=PAIR_LAYOUTS, default=None,
                      help="restart: <s> a </s> <s> b </s>; continuous: <s> a </s> b </s> (default: the run's)")
  parser.add_argument("--gold", default=None, help="gold alignments, one entry per input pair")
  parser.add_argument("--gold_format", choices=aer.GOLD_FORMATS, default="pharaoh")
  parser.add_argument("--sweep", action="store_true", help="score all layers and methods against --gold")
  return parser.parse_args(argv)


def job_of(args: argparse.Namespace):
  """The `AlignJob` of the flags: the solver's flags (an unset similarity left out) go in its `solver`."""
  from flax_xalign import ops
  from flax_xalign.evaluation.word_alignment.align_job import AlignJob

  solver_fields = {f.name for f in dataclasses.fields(ops.AlignmentSolver)}
  solver = {name: getattr(args, name) for name in solver_fields if getattr(args, name) is not None}
  return AlignJob(**{k: v for k, v in vars(args).items() if k not in solver_fields}, solver=solver)


def run(args: argparse.Namespace) -> None:
  from flax_xalign.evaluation.word_alignment import align_job

  common.check_outside_run(args.output, args.model_dir)  # (The run's own files are named in cli/.)
  align_job.align(job_of(args))


def main(argv: Sequence[str] | None = None) -> int:
  return common.main_of(parse_args, run, argv)


if __name__ == "__main__":
  sys.exit(main())
