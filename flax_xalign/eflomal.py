"""`python -m flax_xalign.eflomal`: word links from eflomal beside the bitext (`flax_xalign.cli.eflomal`)."""

import sys

from flax_xalign.cli.eflomal import main

if __name__ == "__main__":
  sys.exit(main())
