"""Atomic file writes: readers never see a half-written file.

Everything that writes into a MODEL_DIR or a cache (vocabularies, manifests,
dictionaries, alignment files, experiment results) goes through
`write_atomically`: a temporary file in the destination folder, then a rename.
A full disk or file-size limit (ENOSPC, EDQUOT, EFBIG) becomes one UserError
and leaves no temporary file behind.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Iterator

from flax_xalign.errors import UserError

# A write that failed for want of space: disk full, quota, file-size limit.
NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def no_space_error(e: OSError, path: str | os.PathLike) -> UserError | None:
  """The UserError for a write that failed for want of space (disk full, quota, file-size limit), else None."""
  if e.errno not in NO_SPACE_ERRNOS:
    return None
  return UserError(f"no space left writing {os.fspath(path)} ({os.strerror(e.errno)}); free space or choose "
                   "another MODEL_DIR (or output folder).")


def _umask() -> int:
  """The process umask, read without setting it (os.umask sets it, racing with threads that create files)."""
  try:
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith("Umask:"):
          return int(line.split()[1], 8)
  except (OSError, ValueError, IndexError):
    pass
  umask = os.umask(0o022)
  os.umask(umask)
  return umask


def write_atomically(path: str | os.PathLike, data: str | bytes) -> None:
  """Writes `data` (text as UTF-8, or bytes) to `path` via a temporary file and rename.

  Raises:
    UserError: `path` is a folder, or no space is left (ENOSPC, EDQUOT, EFBIG; the
      temporary file is removed).
  """
  path = os.fspath(path)
  if os.path.isdir(path):
    raise UserError(f"{path} is a folder; name a file to write (e.g. {os.path.join(path, 'out.txt')}).")
  folder = os.path.dirname(os.path.abspath(path))
  try:
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=os.path.basename(path) + ".tmp")
  except OSError as e:
    error = no_space_error(e, path)
    if error is None:
      raise
    raise error from e
  try:
    mode, options = ("w", {"encoding": "utf-8"}) if isinstance(data, str) else ("wb", {})
    with os.fdopen(fd, mode, **options) as f:
      # mkstemp creates 0600; a written file gets the mode `open` would give it (0666 less the umask).
      os.fchmod(f.fileno(), 0o666 & ~_umask())
      f.write(data)
    os.replace(tmp, path)
  except BaseException as e:
    try:
      os.unlink(tmp)
    except FileNotFoundError:
      pass
    error = no_space_error(e, path) if isinstance(e, OSError) else None
    if error is None:
      raise
    raise error from e


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
