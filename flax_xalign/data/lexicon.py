"""`python -m flax_xalign.data.lexicon` (the documented spelling) runs the `flax_xalign.cli.lexicon` command.

The lexicon readers themselves are `flax_xalign.data.sources.lexicon`.
"""

if __name__ == "__main__":
  import sys

  from flax_xalign.cli.lexicon import main

  sys.exit(main())
