r"""Table 1 and Fig. 3 of Lu, Lu & Zhang (2023) on real languages from Debian: X -> English BLI per language.

  xalign bli_table --model_dir=MODEL_DIR --data_dir=DEBIAN_DIR \
      [--languages=ar,de,el,fr,hi,ru] [--split=test] [--min_count=5] [--select_min_count=2,5,10,20] \
      [--layers=all] [--max_sentences=1000] [--knn=10] [--output=DIR]

For each language X it runs `xalign bli`'s evaluation (`evaluate_lexicon`) of
MODEL_DIR (an import such as `xalign e5_small`, whose languages include X and en)
with src=X, tgt=en: the language-specific vocabularies (§2.1; tokens with count > --min_count in
X's Debian text vs the English help text, shared ones removed) tokenised with MODEL_DIR's own
vocabulary.model; the CSLS and NN dictionaries of the token-embedding table (layer 0); Hit@1 /
Hit@5 against DEBIAN_DIR/bli/<x>-en.<split>.txt (`xalign debian_data`, sources bli); and
per layer Hit@1, mean translation-pair cosine and RSIM over the gold pairs (contextual states
averaged over --max_sentences sentences per language).

X's text is DEBIAN_DIR/help/<x>.train.txt, or gettext/<x>.txt (the UI catalogues' translations)
for a language without help (Arabic); English is help/en.train.txt.

--select_min_count picks --min_count on the DEV words (layer 0 only): the value with the most
dev words translated correctly (CSLS Hit@1 x dev queries, summed over languages; a higher
threshold shrinks the candidate set but loses coverage), then scores --split with it.

Writes OUTPUT/bli_table.json (all numbers), OUTPUT/bli_table.md (the table) and
OUTPUT/bli_per_layer.png (one Fig. 3-shaped plot: every language thin, the mean thick), plus
the exported CSLS dictionaries OUTPUT/dict/<x>-en.tsv. The last line printed is the JSON.
The work is `flax_xalign.experiments.bli_table`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from flax_xalign.cli import common
from flax_xalign.errors import ArgumentParser
from flax_xalign.experiments import bli_table
from flax_xalign.experiments.bli_table import DEFAULT_LANGUAGES


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = ArgumentParser(prog="xalign bli_table", description=__doc__.splitlines()[0])
  common.add_model_dir_flag(parser, help="MODEL_DIR of the model (e.g. a multilingual-e5-small import)")
  parser.add_argument("--data_dir", required=True, help="a `xalign debian_data` build with bli/")
  parser.add_argument("--languages", default=",".join(DEFAULT_LANGUAGES), help="comma list of X (X -> en)")
  parser.add_argument("--split", choices=("dev", "test"), default="test", help="gold words to score")
  parser.add_argument("--min_count", type=int, default=5, help="language-specific vocabularies: count > N")
  parser.add_argument("--select_min_count", default=None,
                      help="comma list: choose --min_count among these on the dev words first")
  parser.add_argument("--layers", default="all", help="'all', a comma list, or 'none' (layer 0 only)")
  parser.add_argument("--max_sentences", type=int, default=1000, help="sentences per language for layers > 0")
  parser.add_argument("--knn", type=int, default=10, help="K of CSLS")
  parser.add_argument("--output", default=None, help="output folder (default MODEL_DIR/bli_table)")
  return parser.parse_args(argv)


def run(args: argparse.Namespace) -> dict:
  settings = bli_table.BliTableSettings(**vars(args))
  checked = bli_table.plan(settings)  # Every input and the output folder, before the model is read.
  common.existing_model_dir(settings.model_dir)
  return bli_table.write_table(settings, checked)


def main(argv: Sequence[str] | None = None) -> int:
  return common.main_of(parse_args, run, argv)


if __name__ == "__main__":
  sys.exit(main())
