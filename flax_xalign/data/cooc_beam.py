"""`python -m flax_xalign.data.cooc_beam` (the documented spelling) runs the `flax_xalign.cli.cooc_beam` command.

The Beam pipeline itself is `flax_xalign.data.cooc.beam`.
"""

if __name__ == "__main__":
  import sys

  from flax_xalign.cli.cooc_beam import main

  sys.exit(main())
