"""`python -m flax_xalign.train`: the pretraining command at the path t5x users type (it is `flax_xalign.cli.train`)."""

import sys

from flax_xalign.cli.train import main

if __name__ == "__main__":
  sys.exit(main())
