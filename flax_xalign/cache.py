"""`python -m flax_xalign.cache`: writes a packed dataset (the command: `flax_xalign.cli.cache`)."""

import sys

from flax_xalign.cli.cache import main, parse_args, run  # noqa: F401

if __name__ == "__main__":
  sys.exit(main())
