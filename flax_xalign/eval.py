"""`python -m flax_xalign.eval`: the evaluation command at the path t5x users type (it is `flax_xalign.cli.eval`)."""

import importlib.util  # noqa: F401  (must precede gin file parsing on gin 0.5)
import sys

from flax_xalign.cli.eval import main

if __name__ == "__main__":
  sys.exit(main())
