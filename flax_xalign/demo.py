"""`python -m flax_xalign.demo` (`make demo`): kept as an alias of `flax_xalign.cli.demo`."""

import sys

from flax_xalign.cli.demo import (E5_ALIGNER, METHODS, aer_comparison, e5_demo, main,  # noqa: F401  (old paths)
                                  statistical_peer)

if __name__ == "__main__":
  sys.exit(main())
