"""`python -m flax_xalign.experiments.mlm_gc`: kept as an alias of
`flax_xalign.cli.experiments.mlm_gc`."""

import sys

from flax_xalign.cli.experiments.mlm_gc import (  # noqa: F401  (old import paths)
    LABELS, NATURAL_LEXICON, OBJECTIVES, SETTINGS, format_table, main, parse_args, plot, setting_rows)

if __name__ == "__main__":
  sys.exit(main())
