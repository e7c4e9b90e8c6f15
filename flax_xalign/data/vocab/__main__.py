"""`python -m flax_xalign.data.vocab` (the documented spelling) runs the `flax_xalign.cli.vocab` command."""

if __name__ == "__main__":
  import sys

  from flax_xalign.cli.vocab import main

  sys.exit(main())
