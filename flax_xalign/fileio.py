"""Atomic file writes: readers never see a half-written file.

Everything that writes into a MODEL_DIR or a cache (vocabularies, manifests,
dictionaries, alignment files, experiment results) goes through
`write_atomically`: a temporary file in the destination folder, then a rename.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

from flax_xalign.errors import UserError


def write_atomically(path: str | os.PathLike, data: str | bytes) -> None:
  """Writes `data` (text as UTF-8, or bytes) to `path` via a temporary file and rename."""
  path = os.fspath(path)
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=folder, prefix=os.path.basename(path) + ".tmp")
  try:
    # mkstemp creates 0600; a written file gets the mode `open` would give it (0666 less the umask).
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)
    if isinstance(data, str):
      with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(data)
    else:
      with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


def utf8_lines(path: str, *, what: str = "the file") -> Iterator[tuple[int, str]]:
  """(line number, line without its newline) of a UTF-8 file, read lazily.

  Raises:
    UserError: a line is not UTF-8, named as `path:line` (re-encode `what`).
  """
  with open(path, "rb") as f:
    for number, raw in enumerate(f, start=1):
      try:
        yield number, raw.decode("utf-8").rstrip("\r\n")
      except UnicodeDecodeError as e:
        raise UserError(f"{path}:{number}: not valid UTF-8 ({e.reason} at byte {e.start}); "
                        f"re-encode {what} as UTF-8.") from e


def save_figure(figure, path: str | os.PathLike, *, dpi: int = 120) -> None:
  """Renders a matplotlib figure to PNG and writes it atomically."""
  import io

  buffer = io.BytesIO()
  figure.savefig(buffer, format="png", dpi=dpi)
  write_atomically(path, buffer.getvalue())
