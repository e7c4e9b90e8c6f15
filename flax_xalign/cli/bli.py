r"""Bilingual lexicon induction from a checkpoint (Lu, Lu & Zhang 2023, §2.2, Table 1, Fig. 3).

  xalign bli --model_dir=DIR --src=grc --tgt=en [--layer=0] [--method=csls|nn] \
      [--output=dict.tsv] [--gold=FILE|token_map] [--min_count=N] [--knn=10] \
      [--layers=all --rsim_plot=PATH] [--max_sentences=5000] [--task=NAME|bible] [--normalize=...] \
      [--isomorphism [--quadruples=2000] [--seed=0]]

Induces a token-level dictionary between the language-specific vocabularies
of --src and --tgt (tokens with count > --min_count in each language's train
text, shared ones removed; the MODEL_DIR's `lang_vocab.tsv` when it has one
and --min_count is not given) from the token-embedding table (--layer=0) or
from the contextual states of --layer averaged over the token's occurrences
in at most --max_sentences monolingual sentences per language. --output gets
`src<TAB>tgt<TAB>score` (SentencePiece pieces, '▁' = word start; best score
first). --gold scores it: a MUSE file (`src tgt` per line; the shipped
Greek->English one is flax_xalign/data/lexicons/grc-en.train.txt), words
normalised as the task normalises text and counted only when they are single
tokens of the language-specific vocabularies (the rest is reported as out of
coverage), or `token_map` for a synthetic run's gold natural <-> derived
ids. It prints Hit@1 / Hit@5 for NN and CSLS and the coverage; the LAST line is
a JSON object: `hit@1`, `hit@5` (of --method), `coverage`, `pairs` (the gold
queries scored), then `nn` / `csls` (both methods), `entries`, `covered`,
`out_of_coverage` and the settings. --layers=all (or a list, `0,4,8`) adds
Hit@1, the mean cosine and the RSIM of the translation pairs (the gold's, else
the layer-0 CSLS dictionary's) at each layer, on the tokens every layer has,
and --rsim_plot draws them (the paper's Fig. 3).

--isomorphism (with --gold; `evaluation/isomorphism.py`) adds Ai & Fang's
isomorphism measures at the embedding layer, over EVERY listed gold pair, not
only single-token ones: `muse_cosine` (Table 2: the mean cosine of the gold
pairs, a word = the mean of its pieces' embeddings; `shuffled_mean`, the mean
cosine of mismatched pairs, is the baseline to read it against; `coverage`
and `skipped` count pairs with an empty word or the unknown piece; with
--layers, `per_layer` gives both at each layer over the pairs every layer
has) and `analogy` (`accuracy`: top-1 of a_src - a_tgt + b_tgt -> b_src over
--quadruples seeded samples of two gold pairs; `mono_accuracy`: b_src - a_src
+ a_tgt -> b_tgt; `nn_accuracy`: b_tgt's nearest source word, the no-offset
floor). With --gold=token_map the pairs are the token map's within the
language-specific vocabularies.

The text comes from the run's task; an import records none: pass --task=NAME
(a registered task or mixture) or --task=bible (the embedded Greek-English
Bible under the checkpoint's vocabulary; for multilingual-e5 add
--normalize=nfd_strip_marks, as its Bible runs do).

The work is `evaluation.lexicon_eval.evaluate_lexicon` (also the `bli`,
`rsim` and `isomorphism` evaluators of `python -m flax_xalign.eval`);
`python -m flax_xalign.cli.bli` is the same command. `--checkpoint` is
still accepted for `--model_dir`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from flax_xalign.cli import common
from flax_xalign.errors import ArgumentParser
from flax_xalign.evaluation.lexicon.lexicon_eval import DEFAULT_MAX_SENTENCES, TOKEN_MAP_GOLD, LexiconOptions  # noqa: F401


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  from flax_xalign.data.vocab import normalize
  from flax_xalign.evaluation.lexicon import bli
  from flax_xalign.evaluation.lexicon import isomorphism
  parser = ArgumentParser(prog="xalign bli", description=__doc__.splitlines()[0])
  common.add_model_dir_flag(parser, help="MODEL_DIR with a checkpoint")
  parser.add_argument("--src", required=True, help="source language code (one of the run's languages)")
  parser.add_argument("--tgt", required=True, help="target language code")
  parser.add_argument("--layer", type=int, default=0, help="0: token-embedding table; l > 0: contextual states")
  parser.add_argument("--method", choices=bli.METHODS, default="csls")
  parser.add_argument("--output", default=None, help="dictionary file: src<TAB>tgt<TAB>score per line")
  parser.add_argument("--gold", default=None, help=f"MUSE lexicon file, or '{TOKEN_MAP_GOLD}' (synthetic run)")
  parser.add_argument("--min_count", type=int, default=None,
                      help="language-specific tokens: count > N (default: MODEL_DIR/lang_vocab.tsv, else the "
                           "run's lang_vocab option, else 100)")
  parser.add_argument("--knn", type=int, default=bli.DEFAULT_KNN, help="K of CSLS")
  parser.add_argument("--layers", default=None, help="'all' or a comma list: per-layer Hit@1, cosine, RSIM")
  parser.add_argument("--rsim_plot", default=None, help="PNG of the per-layer curves (with --layers)")
  parser.add_argument("--max_sentences", type=int, default=DEFAULT_MAX_SENTENCES,
                      help="monolingual sentences per language read for layers > 0")
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--task", default=None, help="task or mixture of the text (default: the run's); 'bible'")
  parser.add_argument("--normalize", choices=normalize.NORMALIZERS, default=None,
                      help="text normaliser of the gold words (default: the task's)")
  parser.add_argument("--split", default="train", help="split of the text (vocabularies and layers > 0)")
  parser.add_argument("--isomorphism", action="store_true",
                      help="with --gold: MUSE cosine (gold-pair cosine, multi-piece words averaged, vs shuffled "
                           "pairs) and translation analogies")
  parser.add_argument("--quadruples", type=int, default=isomorphism.DEFAULT_QUADRUPLES,
                      help="analogy quadruples sampled (with --isomorphism)")
  parser.add_argument("--seed", type=int, default=0, help="seed of the analogy sample")
  return parser.parse_args(argv)


def options_of(args: argparse.Namespace) -> LexiconOptions:
  """The evaluation's options: every flag but the run directory."""
  return LexiconOptions(**{k: v for k, v in vars(args).items() if k != "model_dir"})


def check_files(args: argparse.Namespace) -> None:
  """The outputs are none of the inputs and can be written; the gold file can be read (before any work)."""
  from flax_xalign import fileio

  gold = args.gold if args.gold and args.gold != "token_map" else None
  inputs = {"--gold": gold}
  for flag, path in (("--output", args.output), ("--rsim_plot", args.rsim_plot)):
    if path is not None:
      common.check_outside_run(path, args.model_dir, setting=flag)
      fileio.check_output_file(path, setting=flag, inputs=inputs)
  if gold:
    fileio.check_input_file(gold, setting="--gold")


def run(args: argparse.Namespace) -> dict:
  """Runs the command on parsed `args`; returns the JSON object it prints last (for drivers and notebooks)."""
  from flax_xalign.evaluation.lexicon.lexicon_eval import evaluate_lexicon
  from flax_xalign.runs import Run

  options = options_of(args).check()  # Bad flags are reported before the run is read.
  check_files(args)
  result = evaluate_lexicon(Run.open(common.existing_model_dir(args.model_dir)), options,
                            log=lambda line: print(line, flush=True))
  print(json.dumps(result, ensure_ascii=False), flush=True)
  return result


def main(argv: Sequence[str] | None = None) -> int:
  return common.main_of(parse_args, run, argv)


if __name__ == "__main__":
  sys.exit(main())
