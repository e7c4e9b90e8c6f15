"""`python -m flax_xalign.cli <command> [flags]`: the same as the console script `xalign` (`cli/xalign.py`)."""

import sys

from flax_xalign.cli.xalign import main

sys.exit(main())
