"""`python -m flax_xalign.retrieval`: kept as an alias of `flax_xalign.cli.retrieval` (the work:
`evaluation.retrieval.evaluate_retrieval`)."""

import sys

from flax_xalign.cli.retrieval import BIBLE_SPLITS, main, options_of, parse_args, read_pairs, run  # noqa: F401

if __name__ == "__main__":
  sys.exit(main())
