"""`python -m flax_xalign.debian_data`: kept as an alias of `flax_xalign.cli.debian_data`."""

import sys

from flax_xalign.cli.debian_data import ROOT_ENV, main, parse_args, run  # noqa: F401  (old import paths)

if __name__ == "__main__":
  sys.exit(main())
