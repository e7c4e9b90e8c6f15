"""`python -m flax_xalign.cooc`: kept as an alias of `flax_xalign.cli.cooc`."""

import sys

from flax_xalign.cli.cooc import count, count_text, inspect, main, parse_args  # noqa: F401  (old import paths)

if __name__ == "__main__":
  sys.exit(main())
