"""The TCS-MLM / SCS-MLM miniature laboratory (Lu, Lu & Zhang 2023) at laptop scale.

  xalign code_switch --model_dir=runs/code_switch \
      [--settings=synthetic,natural] [--objectives=mlm,tcs,scs[,gc]] [--base_steps=N] [--steps=N] \
      [--natural_steps=N] [--e5_dir=runs/e5_bible] [--finetune_steps=150] [--max_sentences=N] [--fresh] \
      [--debian_data=runs/debian_data] [--debian_steps=N] [--seeds=2] [--debian_gold=DIR/{lang}-en.txt]

Three settings, each a starting model (a true mono-mPLM only in `synthetic`: e5-small was trained on
text pairs, translations among them) continued at the same budget with
MLM (the baseline), TCS-MLM and SCS-MLM through the real entry point
(`flax_xalign.train` + gin_configs/experiments/code_switch/*.gin):

* `synthetic` (ground truth): the Greek NT and its transliterated copy (token
  i <-> i + V, 10% of the pieces left shared as anchors) trained with MLM only
  from scratch for --base_steps (the mono-mPLM), then continued for --steps.
  The true dictionary is the token map, so Hit@k and RSIM are exact; POS
  tagging gives SUP / ZS / Δ through the transfer harness of the ALIGN-MLM
  grid (fine-tune on Greek, test on the transliterated copy).
* `debian` (also `natural`): multilingual-e5-small continued on the
  monolingual LibreOffice help text of every built language and English for
  --debian_steps, --seeds times per objective, MLM-GC (`gc`) beside the
  three by default; BLI / RSIM / MUSE cosine per language to English and
  sentence retrieval, before and after (`e5_debian`'s docstring says how).
* `bible`: multilingual-e5-small (imported offline, trimmed to the Bible's
  pieces: --e5_dir, imported there if missing) continued on the two
  monolingual Bible streams (Greek and English train books) for
  --natural_steps; BLI against the shipped Greek->English lexicon
  (flax_xalign/data/lexicons/grc-en.train.txt). (`natural` named this
  setting until the Debian data gave e5 eight natural languages.)

The synthetic and bible models (the starting ones included) are scored with
`xalign bli`'s machinery: Hit@1/5 of NN and CSLS at the
embedding layer between the two language-specific vocabularies (count >
--min_count), and RSIM and the mean cosine of translation pairs at every layer
(contextual states averaged over --max_sentences sentences per language).
Writes MODEL_DIR/results.json (rewritten after every row; a rerun skips
finished rows), results.md (the tables) and one rsim_<setting>.png per setting
(RSIM per layer and ΔRSIM against continued MLM: the paper's Fig. 7 shape).
The work is `flax_xalign.experiments.code_switch`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from flax_xalign.cli import common
from flax_xalign.cli import setup_process
from flax_xalign.cli.experiments import add_debian_arguments
from flax_xalign.errors import ArgumentParser
from flax_xalign.experiments import code_switch
from flax_xalign.experiments.code_switch import SETTINGS


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = ArgumentParser(prog="xalign code_switch", description=__doc__.splitlines()[0])
  parser.add_argument("--model_dir", required=True)
  parser.add_argument("--settings", default="synthetic,natural", help=f"of {', '.join(SETTINGS)}; natural = debian")
  parser.add_argument("--objectives", default="", help="default: mlm,tcs,scs (debian: also gc); synthetic also "
                      "takes tcs_gold, TCS with a 50%%-correct true dictionary (a control)")
  parser.add_argument("--base_steps", type=int, default=5000, help="MLM steps of the synthetic mono-mPLM")
  parser.add_argument("--steps", type=int, default=600, help="continuation steps, synthetic setting")
  parser.add_argument("--natural_steps", type=int, default=100, help="continuation steps, bible setting")
  parser.add_argument("--base_dir", default=None, help="an existing synthetic mono-mPLM MODEL_DIR to start from")
  parser.add_argument("--e5_dir", default="runs/e5_bible", help="the imported, Bible-trimmed e5-small")
  parser.add_argument("--min_count", type=int, default=5, help="language-specific vocabularies: count > N")
  parser.add_argument("--max_sentences", type=int, default=1000, help="sentences per language for layers > 0")
  parser.add_argument("--finetune_steps", type=int, default=150)
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

  return code_switch.run(code_switch.CodeSwitchSettings(**vars(args)), trainer=gin_cli.train)


if __name__ == "__main__":
  sys.exit(main())
