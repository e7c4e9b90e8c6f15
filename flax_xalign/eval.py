"""`python -m flax_xalign.eval`: the evaluation entry point, kept at its contract path.

The command lives in `flax_xalign.cli.eval`; this module re-exports it.
"""

import importlib.util  # noqa: F401  (must precede gin file parsing on gin 0.5)
import sys

from flax_xalign.cli.eval import main  # noqa: F401  (the contract path)

if __name__ == "__main__":
  sys.exit(main())
