"""Atomic file writes: readers never see a half-written file.

Everything that writes into a MODEL_DIR or a cache (vocabularies, manifests,
dictionaries, alignment files, experiment results) goes through
`write_atomically`: a temporary file in the destination folder, then a rename.
A full disk or file-size limit (ENOSPC, EDQUOT, EFBIG) becomes one UserError
and leaves no temporary file behind.

It is also the one place that turns an OSError on a path into the user's
one-line form (`errors.path_error`: permission denied, a read-only file system, a
path under a file, a missing file, a full disk), used by `write_atomically`,
`makedirs`, `utf8_lines` and, as the last resort, by every entry point
(`errors.run_command`). The output rules every command checks right after
parsing its flags, before any work (`check_output_file`,
`check_output_folder`, `check_input_file`): an output is never one of the
command's inputs, its folder can be written and does not lie under a file,
and a folder output is new, empty or the command's own kind of folder.

Writers that share an output folder take its lock (`output_lock`: a second
writer is refused in one line, a killed one never blocks the next) and mark
what they wrote (`write_mark`), so that `--overwrite` removes only a folder
whose mark names the command and the files it holds (`check_own_folder`),
never one recognised by its file names alone.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import stat
import sys
import tempfile
from collections.abc import Iterable, Iterator
from typing import Any

from flax_xalign import storage
from flax_xalign.errors import UserError, path_error

def makedirs(path: str | os.PathLike, *, setting: str = "") -> None:
  """os.makedirs(path, exist_ok=True), an OSError becoming one UserError (`path_error`); nothing for a URL."""
  if storage.is_url(path):
    return
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    raise path_error(e, path, setting=setting, doing="create the folder") from e


def writable_folder(folder: str) -> bool:
  """Whether this process can create files in `folder` (root included: a read-only mount says no)."""
  if not os.access(folder, os.W_OK | os.X_OK):
    return False
  try:  # os.access answers yes to root on a read-only mount.
    return not os.statvfs(folder).f_flag & os.ST_RDONLY
  except OSError:
    return True


def _same_path(a: str, b: str) -> bool:
  """Whether two paths name one file or folder (symlinks and hard links followed)."""
  if os.path.realpath(a) == os.path.realpath(b):
    return True
  try:
    return os.path.samefile(a, b)
  except OSError:
    return False


def lies_in(path: str, folder: str) -> bool:
  """Whether `path` is `folder` or lies under it (symlinks followed; in a bucket, which has none, the names)."""
  if storage.is_url(path) or storage.is_url(folder):
    path, folder = storage.absolute(path), storage.absolute(folder)
    return path == folder or path.startswith(folder + "/")
  path, folder = os.path.realpath(path), os.path.realpath(folder)
  return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _check_parent(path: str, setting: str) -> None:
  """`path` is not under a file and the folder it would be created in can be written."""
  existing = os.path.dirname(path)
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise UserError(f"{setting} {path} lies under {existing}, which is a file; choose a path under a folder.")
  if not writable_folder(existing):
    raise UserError(f"{setting} {path} would be written in {existing}, which is not writable; choose a writable "
                    "folder or fix its permissions.")


def _inputs(inputs) -> list[tuple[str, str]]:
  """(flag, path) of every named input; values may be None (not given) or a list of paths."""
  out = []
  for flag, value in dict(inputs or {}).items():
    for path in ([] if value is None else [value] if isinstance(value, (str, os.PathLike)) else value):
      if path is not None and os.fspath(path):
        out.append((flag, os.fspath(path)))
  return out


def check_output_file(path: str | os.PathLike, *, setting: str = "--output", inputs=None, inside_ok=()) -> str:
  """The absolute path of an output file, checked before any work; UserError names what is wrong.

  Refused: an empty name, a folder, a path under a file, a folder that cannot be
  written, a file that cannot be replaced, a path that is one of `inputs`
  ({flag: path, list of paths or None}; symlinks followed) and a path inside an
  input folder, unless that input's flag is in `inside_ok` (a run, whose own
  files `cli.common.check_outside_run` guards, may hold a new file).
  """
  text = os.fspath(path) if path is not None else ""
  if not text.strip():
    raise UserError(f"{setting} is empty; name the file to write.")
  if storage.is_url(text):
    return _check_output_url(text, setting=setting, inputs=inputs, folder=False, inside_ok=inside_ok)
  path = os.path.abspath(os.path.expanduser(text))
  for flag, source in _inputs(inputs):
    if _same_path(path, source):
      raise UserError(f"{setting} {text} is the {flag} file; the output would replace it: name another file.")
  _refuse_inside_input(path, text, setting=setting, inputs=inputs, inside_ok=inside_ok)
  if os.path.isdir(path):
    raise UserError(f"{setting} {text} is a folder; name a file to write (e.g. {os.path.join(text, 'out.txt')}).")
  _check_parent(path, setting)
  if os.path.exists(path) and not os.access(path, os.W_OK):
    raise UserError(f"{setting} {text} exists and cannot be replaced (not writable); choose another file or fix "
                    "its permissions.")
  return path


def check_output_folder(path: str | os.PathLike, *, setting: str = "--output", inputs=None,
                        owned=None, what: str = "", inside_ok=()) -> str:
  """The absolute path of an output folder, checked before any work; UserError names what is wrong.

  Refused: an empty name, a file, a path under a file, an unwritable folder, a
  folder that is, holds or lies inside one of `inputs` (see `check_output_file`),
  and a non-empty folder that `owned(folder)` does not recognise as this
  command's (`owned` None: any non-empty folder is refused). `what` names the
  kind of folder `owned` recognises, for the message ("a flax_xalign run (...)").
  """
  text = os.fspath(path) if path is not None else ""
  if not text.strip():
    raise UserError(f"{setting} is empty; name the folder to write.")
  if storage.is_url(text):
    return _check_output_url(text, setting=setting, inputs=inputs, folder=True, owned=owned, what=what,
                             inside_ok=inside_ok)
  folder = os.path.abspath(os.path.expanduser(text))
  for flag, source in _inputs(inputs):
    if os.path.lexists(source) and lies_in(source, folder):
      where = "is" if _same_path(source, folder) else "holds"
      raise UserError(f"{setting} {text} {where} the {flag} {source}; writing there would replace it: name "
                      "another folder.")
  _refuse_inside_input(folder, text, setting=setting, inputs=inputs, inside_ok=inside_ok)
  if os.path.exists(folder) and not os.path.isdir(folder):
    raise UserError(f"{setting} {text} is a file, not a folder; choose another folder or move the file.")
  if os.path.isdir(folder):
    if not writable_folder(folder):
      raise UserError(f"{setting} {text} is not writable; choose a writable folder or fix its permissions.")
    _refuse_foreign_folder(folder, text, setting=setting, owned=owned, what=what)
  else:
    _check_parent(folder, setting)
  return folder


def _check_output_url(text: str, *, setting: str, inputs, folder: bool, owned=None, what: str = "",
                      inside_ok=()) -> str:
  """`check_output_file` / `check_output_folder` of a URL: the bucket is there, no input is or lies under it."""
  storage.check_store(text, setting=setting)
  url = storage.absolute(text)
  for flag, source in _inputs(inputs):
    if storage.is_url(source) and (lies_in(source, url) if folder else storage.absolute(source) == url):
      where = "is" if storage.absolute(source) == url else "holds"
      raise UserError(f"{setting} {text} {where} the {flag} {source}; writing there would replace it: name "
                      f"another {'folder' if folder else 'file'}.")
  _refuse_inside_input(url, text, setting=setting, inputs=inputs, inside_ok=inside_ok)
  if not folder:
    if storage.isdir(url):
      raise UserError(f"{setting} {text} holds objects under it (a folder); name a file to write "
                      f"(e.g. {storage.join(text, 'out.txt')}).")
    return url
  if storage.isfile(url):
    raise UserError(f"{setting} {text} is an object (a file), not a folder; choose another folder.")
  _refuse_foreign_folder(url, text, setting=setting, owned=owned, what=what)
  return url


def _refuse_inside_input(path: str, text: str, *, setting: str, inputs, inside_ok) -> None:
  """An output inside an input folder (a bundle, a data folder) is refused: writing there changes the input."""
  for flag, source in _inputs(inputs):
    if flag in inside_ok or storage.is_url(source) != storage.is_url(path):
      continue
    if lies_in(path, source) and not lies_in(source, path) and storage.isdir(source):
      raise UserError(f"{setting} {text} lies inside the {flag} {source}; writing there would change that input: "
                      f"name a path outside it.")


def _refuse_foreign_folder(folder: str, text: str, *, setting: str, owned, what: str) -> None:
  """A non-empty output folder (local or in a bucket) that `owned` does not recognise is refused."""
  if storage.listdir(folder) and not (owned is not None and owned(folder)):
    kind = f" that is not {what}" if owned is not None else ""
    raise UserError(f"{setting} {text} is a non-empty folder{kind}; choose a new or empty folder (nothing in it "
                    "was touched).")


def check_input_file(path: str | os.PathLike, *, setting: str) -> str:
  """`path`, checked as a readable file before any work; UserError names what is wrong."""
  text = os.fspath(path)
  if storage.is_url(text):
    storage.check_store(text, setting=setting)
    if not storage.isfile(text):
      there = "holds objects under it (a folder)" if storage.isdir(text) else "does not exist"
      raise UserError(f"{setting} {text} {there}; name an object that is a file.")
    return storage.absolute(text)
  try:
    mode = os.stat(text).st_mode
  except OSError as e:
    if e.errno == errno.ELOOP:
      raise UserError(f"{setting} {text} is a loop of symbolic links; point it at a file.") from None
    if os.path.islink(text):
      raise UserError(f"{setting} {text} is a symbolic link to {os.readlink(text)}, which does not exist; "
                      "fix the link or name the file itself.") from None
    if e.errno == errno.ENOENT:
      raise UserError(f"{setting} {text} does not exist; check the path.") from None
    raise path_error(e, text, setting=setting, doing="read") from None
  if stat.S_ISDIR(mode):
    raise UserError(f"{setting} {text} is a folder; name a file.")
  if not stat.S_ISREG(mode):
    # A pipe (also a shell's <(...)) can be read once and blocks until written; commands may read twice.
    kind = ("a named pipe (FIFO)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device")
    raise UserError(f"{setting} {text} is {kind}, not a regular file; write its contents to a file and "
                    "pass that.")
  if not os.access(text, os.R_OK):
    raise UserError(f"{setting} {text} cannot be read (permission denied); fix its permissions (chmod +r).")
  return text


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
    UserError: `path` is a folder, or any OSError (no space left, a read-only
      folder, a path under a file; `path_error`); the temporary file is removed.
  """
  path = os.fspath(path)
  if storage.is_url(path):  # An object is written whole or not at all: the store's own atomic write.
    try:
      storage.write_object(path, data.encode("utf-8") if isinstance(data, str) else data)
    except OSError as e:
      raise UserError(f"could not write {path} ({type(e).__name__}: {e}); check the bucket and its "
                      "permissions.") from e
    return
  if os.path.isdir(path):
    raise UserError(f"{path} is a folder; name a file to write (e.g. {os.path.join(path, 'out.txt')}).")
  folder = os.path.dirname(os.path.abspath(path))
  try:
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=os.path.basename(path) + ".tmp")
  except OSError as e:
    raise path_error(e, path, doing="write") from e
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
    if isinstance(e, OSError):
      raise path_error(e, path, doing="write") from e
    raise


def utf8_lines(path: str, *, what: str = "the file") -> Iterator[tuple[int, str]]:
  """(line number, line without its newline) of a UTF-8 file, read lazily.

  Raises:
    UserError: a line is not UTF-8, named as `path:line` (re-encode `what`).
  """
  try:
    f = storage.open_file(path, "rb")
  except OSError as e:
    raise path_error(e, path, doing="read") from e
  with f:
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


# --- writers that share an output folder: a lock, and a mark of what a command wrote --------------------------

MARK = ".xalign_written_by.json"  # In a folder a command wrote: the command and the files it wrote there.
_held_locks: dict[str, int] = {}  # Lock file -> depth: a process re-entering its own lock is not refused.


def _holder(fd: int) -> str:
  """What the lock file open at `fd` says of its holder ('pid 123 on host: command'), or 'another process'."""
  try:
    text = os.pread(fd, 512, 0).decode("utf-8", "replace").strip()
  except OSError:
    text = ""
  return text.splitlines()[0] if text else "another process"


@contextlib.contextmanager
def output_lock(folder: str | os.PathLike, *, name: str = ".xalign.lock", setting: str = "--output") -> Iterator[str]:
  """Holds an exclusive lock on `folder/name` for the block (the folder is created); yields the lock file's path.

  A second writer (another process) is refused with one UserError naming the
  holder. The lock is `flock`'s: the kernel drops it when its holder dies,
  SIGKILL included, so a killed writer never blocks the next one (no stale
  lock to detect). The file holds the holder's pid, host and command, for that
  message, and is removed when the block ends (with every folder the lock
  created, innermost first, that is still empty). Re-entered by the process
  that holds it, it is simply held on.
  """
  folder = os.path.abspath(os.fspath(folder))
  path = os.path.join(folder, name)
  if _held_locks.get(path):
    _held_locks[path] += 1
    try:
      yield path
    finally:
      _held_locks[path] -= 1
    return
  import pathlib

  created = [p for p in (folder, *map(str, pathlib.PurePath(folder).parents)) if not os.path.isdir(p)]
  fd = _lock(path, folder, setting)
  _held_locks[path] = 1
  try:
    yield path
  finally:
    del _held_locks[path]
    try:  # Removed while still locked: a writer that opened it meanwhile sees another file and opens again.
      os.unlink(path)
    except FileNotFoundError:
      pass
    os.close(fd)
    with contextlib.suppress(OSError):  # Folders made for the lock alone go, innermost first, while empty.
      for made in created:  # (`folder` and its missing parents: a writer that failed early leaves nothing)
        os.rmdir(made)


def _lock(path: str, folder: str, setting: str) -> int:
  """The open, locked lock file `path` (its holder's line written), or a UserError when another holds it."""
  while True:
    makedirs(folder, setting=setting)
    try:
      fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except FileNotFoundError:  # The folder was removed meanwhile: create it again.
      continue
    except OSError as e:
      raise path_error(e, path, setting=setting, doing="create the lock file") from e
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      holder = _holder(fd)
      os.close(fd)
      raise UserError(f"{setting} {folder} is being written by {holder}; wait for it to end or choose another "
                      f"{setting} (nothing was touched).") from None
    except OSError as e:
      os.close(fd)
      raise UserError(f"{setting} {folder} cannot be locked against a second writer ({e.strerror}); write to a "
                      "local folder and copy it over.") from None
    try:
      locked_in_place = os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
      locked_in_place = False
    if locked_in_place:  # (else its holder removed it between our open and our lock: open the new one)
      break
    os.close(fd)
  command = " ".join([os.path.basename(sys.argv[0] or "python"), *sys.argv[1:]])[:300]
  os.ftruncate(fd, 0)
  os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}: {command}\n".encode(), 0)
  return fd


def pid_is_alive(pid: int) -> bool:
  """Whether a process `pid` exists on this host."""
  if pid <= 0:
    return False
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


def write_mark(folder: str | os.PathLike, command: str, files: Iterable[str] = ()) -> None:
  """Marks `folder` as written by `command` (e.g. 'xalign cache'), listing the `files` it wrote there.

  Written first into a folder the command creates (its pid and host tell a
  killed writer's leftovers from a live one's) and again with the full list
  when the folder is complete.
  """
  write_atomically(storage.join(os.fspath(folder), MARK), mark_text(command, files))


def mark_text(command: str, files: Iterable[str] = ()) -> str:
  """What `write_mark` writes (for a writer that puts files through another file system, e.g. Beam's)."""
  mark = {"command": command, "files": sorted(files), "pid": os.getpid(), "host": socket.gethostname()}
  return json.dumps(mark, indent=1) + "\n"


def read_mark(folder: str | os.PathLike) -> dict | None:
  """The mark `write_mark` left in `folder`, or None (no mark, or not one of ours)."""
  try:
    mark = json.loads(storage.read_text(storage.join(os.fspath(folder), MARK)))
  except (OSError, ValueError):
    return None
  if not (isinstance(mark, dict) and isinstance(mark.get("command"), str) and isinstance(mark.get("files"), list)):
    return None
  return mark


def remove_marked_folder(path: str | os.PathLike) -> None:
  """Removes a folder `write_mark` marked, its mark last: a removal cut short still carries the mark (or is empty)."""
  import shutil

  path = os.fspath(path)
  try:
    names = os.listdir(path)
  except FileNotFoundError:  # (gone already: renamed into place before a Ctrl-C was delivered)
    return
  for name in names:
    if name != MARK:
      child = os.path.join(path, name)
      if os.path.isdir(child) and not os.path.islink(child):
        shutil.rmtree(child, ignore_errors=True)
      else:
        with contextlib.suppress(FileNotFoundError):
          os.unlink(child)
  with contextlib.suppress(FileNotFoundError):
    os.unlink(os.path.join(path, MARK))
  with contextlib.suppress(OSError):
    os.rmdir(path)


def check_marked_by(folder: str | os.PathLike, command: str, *, flag: str = "--fresh",
                    setting: str = "--model_dir") -> None:
  """Refuses (UserError) to delete `folder` (`flag`) unless `command` marked it (`write_mark`) when it created it.

  For folders whose contents grow run by run (a demo's runs, a driver's
  settings): the mark, not the names inside, proves they are the command's.
  """
  mark = read_mark(folder)
  if mark is None or mark["command"] != command:
    raise UserError(f"{flag} would delete {setting} {os.fspath(folder)}, which holds no mark of {command} ({MARK}: "
                    "it was not created by it, or by an older version); remove it yourself if it is one, or "
                    f"choose a new {setting}.")


def mark_new_folder(folder: str | os.PathLike, command: str, *, setting: str = "--model_dir") -> None:
  """Creates `folder` and marks it as `command`'s when it is new or empty (an existing one keeps what it has)."""
  makedirs(folder, setting=setting)
  if not os.listdir(folder):
    write_mark(folder, command)


def check_own_folder(folder: str | os.PathLike, command: str, *, setting: str = "--output") -> None:
  """Refuses (UserError) to replace `folder` unless `command` wrote it and it holds only what `command` wrote.

  The proof is the mark `write_mark` left, never the names of the files.
  """
  folder = os.fspath(folder)
  mark = read_mark(folder)
  if mark is None or mark["command"] != command:
    raise UserError(f"{folder} holds no mark of {command} ({MARK}), so --overwrite will not remove it "
                    f"(it was written by hand or by an older version); remove it yourself or choose another "
                    f"{setting}.")
  foreign = sorted(set(storage.listdir(folder)) - set(mark["files"]) - {MARK})
  if foreign:
    raise UserError(f"{folder} holds {', '.join(foreign[:3])}{' ...' if len(foreign) > 3 else ''}, which {command} "
                    f"did not write, so --overwrite will not remove it; move {'them' if len(foreign) > 1 else 'it'} "
                    f"out or choose another {setting}.")
