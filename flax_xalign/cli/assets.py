r"""Builds a run's assets into MODEL_DIR without training (the explicit build step).

  xalign assets --gin_file=experiments/align_mlm/align_mlm.gin \
    --gin_file=experiments/align_mlm/tiny.gin --gin.MODEL_DIR=\"runs/align\" \
    --gin.TRANSFORMS=\"trans\" --gin.MIXTURE_OR_TASK_NAME=\"synthetic_trans_mlm\"

Takes exactly the flags of `python -m flax_xalign.train`, resolves the run
(task, vocabulary, objectives), builds every asset its objectives require and
writes their files into MODEL_DIR (dictionary.tsv, vocabulary.model, ...),
printing one line per asset. A later `flax_xalign.train` with the same flags
loads these files instead of building them (after checking they belong to the
run), so an expensive asset can be built once, inspected or edited, then
trained with. Nothing else is written (no checkpoint, no config.gin).
"""

from __future__ import annotations

import importlib.util  # noqa: F401  (must precede gin file parsing on gin 0.5)
import sys
from typing import Sequence

from flax_xalign.cli import gin_cli


def main(argv: Sequence[str] | None = None) -> int:
  return gin_cli.build_assets(argv, description=__doc__.splitlines()[0])


if __name__ == "__main__":
  sys.exit(main())
