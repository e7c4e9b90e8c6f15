"""`python -m flax_xalign.experiments.code_switch`: kept as an alias of
`flax_xalign.cli.experiments.code_switch`."""

import sys

from flax_xalign.cli.experiments.code_switch import (  # noqa: F401  (old import paths)
    NATURAL_LEXICON, NATURAL_NORMALIZE, OBJECTIVES, SETTINGS, bible_rows, format_table, main, parse_args,
    plot, synthetic_rows)

if __name__ == "__main__":
  sys.exit(main())
