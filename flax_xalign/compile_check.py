"""`python -m flax_xalign.compile_check`: kept as an alias of `flax_xalign.cli.compile_check`."""

import sys

from flax_xalign.cli.compile_check import check, main, xlmr_vocabulary  # noqa: F401  (old import paths)

if __name__ == "__main__":
  sys.exit(main())
