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
accepted for `--model_dir`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections.abc import Sequence

from flax_xalign import storage
from flax_xalign.cli import common
from flax_xalign.errors import ArgumentParser, UserError


def read_pairs(path: str) -> list[tuple[list[str], list[str]]]:
  """(source words, target words) per line of a TSV file; UserError names a bad line."""
  from flax_xalign.evaluation.word_alignment import aer
  return aer.read_pairs(path, setting="--input")


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


def solver_from_args(args: argparse.Namespace):
  """The AlignmentSolver the flags describe (UserError for a bad value); an unset similarity stays the
  field's default until load_aligner replaces it with the model's."""
  from flax_xalign import ops

  fields = {f.name: getattr(args, f.name) for f in dataclasses.fields(ops.AlignmentSolver)}
  return ops.AlignmentSolver(**{k: v for k, v in fields.items() if v is not None})


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


def _scores_line(scores) -> str:
  return (f"P {100 * scores.precision:.1f}  R {100 * scores.recall:.1f}  F1 {100 * scores.f1:.1f}  "
          f"AER {100 * scores.aer:.1f}  ({scores.num_predicted} links, {scores.num_sure} sure)")


def check_files(args: argparse.Namespace) -> None:
  """The output is none of the inputs and can be written; the inputs can be read (before any work)."""
  from flax_xalign import fileio

  inputs = {"--input": args.input, "--gold": args.gold, "--vocabulary": args.vocabulary}
  if args.bible_gold:  # Its gold is written beside --output, then read back as --input and --gold.
    folder = _output_folder(args.output)
    inputs = {"--bible_gold": [storage.join(folder, f"grc_en.{args.bible_gold}.{ext}") for ext in ("tsv", "pharaoh")]}
  common.check_outside_run(args.output, args.model_dir)
  fileio.check_output_file(args.output, inputs=inputs)
  if args.sweep:
    fileio.check_output_file(_plot_path(args.output), setting="--output's plot", inputs=inputs)
  for flag, path in inputs.items():
    if path and not args.bible_gold:
      fileio.check_input_file(path, setting=flag)


def _output_folder(output: str) -> str:
  """The folder (or bucket prefix) --output is written in."""
  return storage.dirname(output) if storage.is_url(output) else os.path.dirname(os.path.abspath(output))


def _plot_path(output: str) -> str:
  return os.path.splitext(output)[0] + "_layers.png"


def run(args: argparse.Namespace) -> None:
  from flax_xalign.evaluation.word_alignment import aer
  from flax_xalign.evaluation.word_alignment import word_align
  from flax_xalign.runs import Run
  check_files(args)
  if args.bible_gold:
    if args.input or args.gold:
      raise UserError("--bible_gold replaces --input and --gold; pass one or the other.")
    args.input, args.gold = word_align.export_bible_gold(args.bible_gold, _output_folder(args.output))
    args.gold_format = "pharaoh"
  elif not args.input:
    raise UserError("pass --input=FILE (source<TAB>target per line), or --bible_gold=test for the embedded verses.")
  pairs = read_pairs(args.input)
  gold = None
  if args.gold:
    gold = aer.read_gold(args.gold, args.gold_format, num_sentences=len(pairs))
    aer.check_gold_fits(gold, pairs, gold_path=f"--gold {args.gold}", input_path=f"--input {args.input}")
  elif args.sweep:
    raise UserError("--sweep scores every layer and method against gold links: pass --gold=FILE.")
  options = solver_from_args(args)
  aligner, _, step = word_align.load_aligner(
      Run.open(args.model_dir), src_lang=args.src_lang, tgt_lang=args.tgt_lang, vocabulary_path=args.vocabulary,
      max_length=args.max_length, batch_size=args.batch_size, options=options, similarity=args.similarity,
      normalize=args.normalize, encoding=args.encoding, pair_layout=args.pair_layout)
  options = aligner.options
  print(aligner.settings.describe(), flush=True)
  layer = args.layer if args.layer is not None else round(2 * aligner.num_layers / 3)
  method = args.method or "sinkhorn"
  aligner.validate([layer], [method])
  print(f"aligning {len(pairs)} pairs ({aligner.src_lang} -> {aligner.tgt_lang}) with {args.model_dir} "
        f"(step {step}, {aligner.num_layers} layers, {aligner.pair_layout} pair layout; "
        f"{options.sinkhorn_kernel} kernel, {options.sinkhorn_order}, mu {options.mu}, "
        f"{options.sinkhorn_iters} iterations, {options.sinkhorn_extraction} extraction)", flush=True)
  start = time.perf_counter()
  if args.sweep:
    methods = tuple(dict.fromkeys(word_align.SWEEP_METHODS + ((args.method,) if args.method else ())))
    every = aligner.run(pairs, layers=range(aligner.num_layers + 1), methods=methods, verbose=True)
    sure, possible = [g.sure for g in gold], [g.possible for g in gold]
    table = {key: aer.score(links, sure, possible) for key, links in every.items()}
    print(aer.format_table(table, title=f"{os.path.basename(args.gold)}, {options.similarity} similarity"))
    plot = _plot_path(args.output)
    aer.plot_layer_curve(table, plot, title=f"{aligner.src_lang}-{aligner.tgt_lang} word alignment")
    print(f"wrote {plot}")
    pinned = [k for k in table if args.method in (None, k[0]) and args.layer in (None, k[1])]
    method, layer = min(pinned, key=lambda k: (table[k].aer, k[1], k[0]))  # Best unless pinned.
    links = every[(method, layer)]
  else:
    links = aligner.align(pairs, layer=layer, method=method)
  seconds = time.perf_counter() - start
  aer.write_pharaoh(args.output, links)
  print(f"wrote {args.output}: {method}, layer {layer}, {options.similarity} similarity "
        f"({seconds:.1f} s, {1000 * seconds / len(pairs):.0f} s per 1000 pairs)")
  if gold is not None:
    print(f"{method} layer {layer}: " + _scores_line(aer.score(links, [g.sure for g in gold],
                                                                [g.possible for g in gold])))


def main(argv: Sequence[str] | None = None) -> int:
  return common.main_of(parse_args, run, argv)


if __name__ == "__main__":
  sys.exit(main())
