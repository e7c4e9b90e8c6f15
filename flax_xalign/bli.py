"""`python -m flax_xalign.bli`: kept as an alias of `flax_xalign.cli.bli` (the work: `evaluation.lexicon_eval`)."""

import sys

from flax_xalign.cli.bli import (DEFAULT_MAX_SENTENCES, TOKEN_MAP_GOLD, main, options_of,  # noqa: F401  (old paths)
                                 parse_args, run)

if __name__ == "__main__":
  sys.exit(main())
