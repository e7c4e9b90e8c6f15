"""`python -m flax_xalign.align`: kept as an alias of `flax_xalign.cli.align`."""

import sys

from flax_xalign.cli.align import main, parse_args, read_pairs, run, solver_from_args  # noqa: F401  (old paths)

if __name__ == "__main__":
  sys.exit(main())
