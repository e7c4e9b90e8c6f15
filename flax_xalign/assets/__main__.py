"""`python -m flax_xalign.assets`: kept as an alias of `python -m flax_xalign.cli.assets` (build a run's assets)."""

if __name__ == "__main__":
  # Only when run: the assets package sits below the commands and imports none of them.
  import sys

  from flax_xalign.cli.assets import main

  sys.exit(main())
