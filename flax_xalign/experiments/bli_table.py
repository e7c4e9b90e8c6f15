"""`python -m flax_xalign.experiments.bli_table`: an alias of `flax_xalign.cli.experiments.bli_table`."""

import sys

from flax_xalign.cli.experiments.bli_table import main  # noqa: F401

if __name__ == "__main__":
  sys.exit(main())
