r"""Evaluation entry point (same flag style as train).

  python -m flax_xalign.eval --gin.MODEL_DIR=\"runs/demo\" [--gin.SPLIT=\"validation\"]
  python -m flax_xalign.eval --gin_file=runs/eval_pairs.gin --gin.MODEL_DIR=\"runs/demo\" \
      --gin.PAIR_TASK=\"xnli\" --gin.TRAIN_TSV=\"en.train.tsv\" --gin.TEST_TSV=\"de.test.tsv\"
  python -m flax_xalign.eval --gin.MODEL_DIR=\"runs/demo\" --gin.EVALS="['mlm','word_align']" \
      --gin.EVAL_OPTIONS="{'word_align': {'bible_gold': 'test'}}"

Scores held-out masked-token accuracy per language against a unigram baseline
and writes MODEL_DIR/eval.json (runs/eval.gin, the default); or, with
runs/eval_pairs.gin, fine-tunes on sentence pairs of one language (XNLI /
PAWS-X TSV) and scores zero-shot transfer to another (pair_transfer.json); or,
with EVALS, runs those registered evaluators (`evaluation/registry.py`) with
EVAL_OPTIONS = {evaluator: {option: value}} and writes one eval.json keyed by
evaluator.
Model size, task and languages come from the checkpoint, so no model gin file
is needed. `python -m flax_xalign.cli.eval` is the same command.
"""

from __future__ import annotations

import importlib.util  # noqa: F401  (must precede gin file parsing on gin 0.5)
import sys
from collections.abc import Sequence

from flax_xalign.cli import gin_cli


def main(argv: Sequence[str] | None = None) -> int:
  code, results = gin_cli.gin_main(argv, description=__doc__.splitlines()[0], configurable="eval_job",
                                  default_gin_files=("runs/eval.gin",))
  if code == 0 and "overall" in results:  # evaluate's masked-token accuracy
    from flax_xalign.evaluation import mlm_eval

    print(mlm_eval.format_table(results))
  elif code == 0 and "zs" not in results:  # pair_transfer prints its own summary line
    from flax_xalign.evaluation import registry

    print(registry.format_summary(results))
  return code


if __name__ == "__main__":
  sys.exit(main())
