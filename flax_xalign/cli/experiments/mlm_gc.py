"""The MLM-GC miniature laboratory (Ai & Fang 2023) at laptop scale.

  xalign mlm_gc --model_dir=runs/mlm_gc \
      [--settings=trans,trans_inv,natural,debian] [--objectives=mlm,gc,gc_output] [--steps=N] \
      [--finetune_steps=150] [--max_sentences=N] [--fresh] [--debian_data=runs/debian_data] [--debian_steps=N] \
      [--seeds=2]

Each setting trains three encoders FROM SCRATCH at the same budget through
the real entry point (`flax_xalign.train` + gin_configs/experiments/mlm_gc/):
MLM (the baseline), MLM-GC with Eq. 3 (hidden states of the masked token and
its neighbours) and MLM-GC with Eq. 6 (the neighbours' output embeddings).
The GC runs count their co-occurrence table over the run's task when they
start (the `cooc` asset: window 2, distance weights 1/(d+1), c_lang).

* `trans`, `trans_inv` (ground truth): the Greek NT and its transliterated
  (and, for trans_inv, also inverted) copy; the true dictionary is the token
  map i <-> i + V, so the gold-pair cosine and Hit@k are exact, and POS tagging
  gives SUP / ZS / Δ (fine-tune on Greek, test on the copy).
* `natural`: the Bible's Greek and English monolingual streams under the
  Bible's own vocabulary; gold = the shipped Greek->English lexicon
  (flax_xalign/data/lexicons/grc-en.train.txt).

* `debian`: not from scratch: multilingual-e5-small continued on the
  monolingual LibreOffice help text of every built language and English for
  --debian_steps, --seeds times per objective, scored before and after with
  BLI / RSIM / MUSE cosine per language to English and sentence retrieval
  (the setting the TCS/SCS driver shares: `e5_debian`'s docstring says how).

Every other model is scored with `xalign bli`'s machinery: the gold
translation pairs' mean cosine at the embedding layer ("MUSE cosine", Table 2;
a multi-piece word is the mean of its pieces) next to the mean cosine of
shuffled pairs, the cross-lingual analogy accuracy, Hit@1 of NN and CSLS, the
mean pair cosine per layer, and the run's last held-out MLM accuracy (GC must
not hurt MLM). Writes MODEL_DIR/results.json (rewritten after every row; a
rerun skips finished rows), results.md and pair_cosine.png. The work is
`flax_xalign.experiments.mlm_gc`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from flax_xalign.cli import common
from flax_xalign.cli import setup_process
from flax_xalign.cli.experiments import add_debian_arguments
from flax_xalign.errors import ArgumentParser
from flax_xalign.experiments import mlm_gc
from flax_xalign.experiments.mlm_gc import OBJECTIVES, SETTINGS


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = ArgumentParser(prog="xalign mlm_gc", description=__doc__.splitlines()[0])
  parser.add_argument("--model_dir", required=True)
  parser.add_argument("--settings", default=",".join(SETTINGS))
  parser.add_argument("--objectives", default=",".join(OBJECTIVES))
  parser.add_argument("--steps", type=int, default=1500, help="training steps of every run")
  parser.add_argument("--min_count", type=int, default=5, help="language-specific vocabularies: count > N")
  parser.add_argument("--max_sentences", type=int, default=500, help="sentences per language for layers > 0")
  parser.add_argument("--finetune_steps", type=int, default=150, help="POS fine-tuning steps (synthetic)")
  parser.add_argument("--gin", action="append", default=[], help="extra gin binding for every run, NAME=VALUE")
  parser.add_argument("--fresh", action="store_true", help="delete model_dir first")
  add_debian_arguments(parser)
  return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
  """The driver's exit status; SIGTERM and Ctrl-C stop it with one line (`common.run_driver`)."""
  return common.run_driver(_main, argv)


def _main(argv: Sequence[str] | None = None) -> int:
  setup_process()
  args = parse_args(argv)
  from flax_xalign.cli import gin_cli

  return mlm_gc.run(mlm_gc.MlmGcSettings(**vars(args)), trainer=gin_cli.train)


if __name__ == "__main__":
  sys.exit(main())
