"""The ALIGN-MLM study at laptop scale: objectives x synthetic languages.

  xalign align_mlm_grid --model_dir=runs/align_mlm \
      [--steps=N] [--transforms=trans,trans_inv] [--objectives=mlm,xlm,dict_mlm,align_mlm] \
      [--size=tiny|base] [--finetune_steps=N] [--tasks=pos,books] [--fresh]

For every transform (a derived language of the Greek NT) and objective, it
pretrains with the real entry point (`flax_xalign.train` with
gin_configs/experiments/align_mlm/<objective>.gin + <size>.gin) into
MODEL_DIR/<transform>/<objective>, reads the embedding alignment score (all
tokens, and tokens outside the training dictionary), then fine-tunes on the
natural language and on the derived language for each task and reports SUP,
ZS and Δ = SUP − ZS (Tang et al., Table 3). Tasks: Greek part-of-speech
tagging (SBLGNT gold tags) and verse classification by book group, on the
corpus' book-level splits.

Writes MODEL_DIR/results.json (one row per objective x transform, rewritten
after each row, so an interrupted grid resumes where it stopped),
results.md (the table) and alignment_vs_delta.png (alignment against Δ per
task, with Spearman's ρ over all rows). The work is
`flax_xalign.experiments.align_mlm_grid`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from flax_xalign.cli import common
from flax_xalign.cli import setup_process
from flax_xalign.errors import ArgumentParser
from flax_xalign.experiments import align_mlm_grid
from flax_xalign.experiments.align_mlm_grid import DEFAULT_TRANSFORMS, OBJECTIVES, TASKS


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = ArgumentParser(prog="xalign align_mlm_grid", description=__doc__.splitlines()[0])
  parser.add_argument("--model_dir", required=True)
  parser.add_argument("--steps", type=int, default=None, help="pretraining steps (default: the size file's)")
  parser.add_argument("--transforms", default=",".join(DEFAULT_TRANSFORMS),
                      help="comma-separated derived languages, e.g. trans,trans_inv,inv")
  parser.add_argument("--objectives", default=",".join(OBJECTIVES))
  parser.add_argument("--size", default="tiny", help="size file in gin_configs/experiments/align_mlm/")
  parser.add_argument("--tasks", default=",".join(TASKS))
  parser.add_argument("--finetune_steps", type=int, default=150)
  parser.add_argument("--finetune_batch", type=int, default=32)
  parser.add_argument("--finetune_lr", type=float, default=1e-3)
  parser.add_argument("--gin", action="append", default=[], help="extra gin binding for every run, NAME=VALUE")
  parser.add_argument("--fresh", action="store_true", help="delete model_dir first")
  return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
  """The driver's exit status; SIGTERM and Ctrl-C stop it with one line (`common.run_driver`)."""
  return common.run_driver(_main, argv)


def _main(argv: Sequence[str] | None = None) -> int:
  setup_process()
  args = parse_args(argv)
  from flax_xalign.cli import gin_cli

  return align_mlm_grid.run(align_mlm_grid.GridSettings(**vars(args)), trainer=gin_cli.train)


if __name__ == "__main__":
  sys.exit(main())
