"""Experiment drivers, one command per paper study: flags, one call into `flax_xalign/experiments/`, printing.

  align_mlm_grid   ALIGN-MLM objectives x synthetic languages (Tang et al., Table 3)
  code_switch      TCS-MLM / SCS-MLM (Lu, Lu & Zhang 2023)
  mlm_gc           MLM-GC (Ai & Fang 2023)
  bli_table        Table 1 / Fig. 3 of Lu et al. on real languages (Debian)

Their work is library code of the same names in `flax_xalign/experiments/`
(with `e5_debian`, the e5-small-on-Debian setting code_switch and mlm_gc
share, `e5_debian_report`, and `harness`: train (resumable), BLI, MLM
accuracy, POS transfer, results.json); their settings are gin files in
gin_configs/experiments/. `xalign <name>` runs each (the same as
`python -m flax_xalign.cli.experiments.<name>`). What two commands share (the
Debian setting's flags) is here, so that no command imports another.
"""

from __future__ import annotations

import argparse


def add_debian_arguments(parser: argparse.ArgumentParser) -> None:
  """The Debian setting's flags (code_switch's and mlm_gc's): the fields of `experiments.e5_debian.DebianSetting`."""
  group = parser.add_argument_group("debian setting")
  group.add_argument("--debian_data", default="runs/debian_data", help="the `xalign debian_data` output")
  group.add_argument("--debian_languages", default="", help="comma list besides English (default: every built one)")
  group.add_argument("--debian_e5_dir", default="runs/e5_debian", help="the imported, help-trimmed e5-small")
  group.add_argument("--debian_steps", type=int, default=80, help="continuation steps of every objective")
  group.add_argument("--seeds", type=int, default=2, help="runs per objective (seeds 0..N-1)")
  group.add_argument("--debian_gold", default="", help="BLI gold, a template with {lang} (default "
                     "DEBIAN_DATA/bli/{lang}-en.test.txt, else the inverted DEBIAN_DATA/dict/en-{lang}.tsv)")
  group.add_argument("--debian_eval_sentences", type=int, default=200,
                     help="sentences per language for the contextual layers of BLI/RSIM")
  group.add_argument("--debian_retrieval_pairs", type=int, default=100, help="held-out pairs per language")
