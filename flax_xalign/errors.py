"""The one exception type for bad user input, and how entry points report it.

Entry points catch `UserError`, print `error: <message>` (which names the
problem and the fix) and exit with status 2, without a traceback. Library code
raises it for anything a user can fix: missing files, malformed rows, unknown
names, mismatched checkpoints.

A UserError can reach an entry point wrapped by what it passed through: gin
0.5 re-raises an exception from inside a configurable as a proxy whose text
ends in `In call to configurable 'train' (<function pretrain at 0x...>)`, and
TF's autograph re-raises one from a traced dataset function with its own
20-line "in user code:" stack as the message. `user_message` digs out the
original, so the user sees one line.
"""


import argparse
import contextlib
import errno
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, NoReturn


class UserError(Exception):
  """Bad input that the user can fix; the message says what and how."""


def _is_gin_proxy(e: BaseException) -> bool:
  """gin.utils.augment_exception_message_and_reraise's proxy (its `__str__` is defined in gin.utils)."""
  return getattr(type(e).__dict__.get("__str__"), "__module__", None) == "gin.utils"


def original(e: BaseException) -> BaseException:
  """`e` without gin's proxies and TF autograph's re-raise around it.

  Both raise their wrapper inside the `except` block that caught the
  original, so the original is the wrapper's `__context__`.
  """
  while True:
    inner = e.__context__
    if inner is None:
      return e
    if _is_gin_proxy(e) or (hasattr(e, "ag_error_metadata") and isinstance(inner, type(e))):
      e = inner
    else:
      return e


def user_message(e: BaseException) -> str:
  """The message of a UserError as raised, free of what gin and autograph add."""
  return str(original(e)).strip()


def report(e: BaseException) -> int:
  """Prints `error: <message>` on stderr; returns the exit status for bad input, 2."""
  print(f"error: {user_message(e)}", file=sys.stderr, flush=True)
  return 2


# A write that failed for want of space: disk full, quota, file-size limit.
NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def no_space_error(e: OSError, path: str | os.PathLike) -> UserError | None:
  """The UserError for a write that failed for want of space (disk full, quota, file-size limit), else None."""
  if e.errno not in NO_SPACE_ERRNOS:
    return None
  return UserError(f"no space left writing {os.fspath(path)} ({os.strerror(e.errno)}); free space or choose "
                   "another MODEL_DIR (or output folder).")


def path_error(e: OSError, path: str | os.PathLike | None = None, *, setting: str = "",
               doing: str = "") -> UserError:
  """The one-line UserError for an OSError on a named path: the path, what went wrong, the fix.

  Args:
    e: the error (its `filename` is the path when `path` is None).
    path: the path the user named (or the file inside it that failed).
    setting: the flag or gin macro that named it ("--output"); shown before the path.
    doing: what was being done ("write", "read", "create the folder"); default "use".
  """
  path = os.fspath(path if path is not None else (e.filename if e.filename is not None else "?"))
  name = f"{setting} {path}" if setting else path
  error = no_space_error(e, path)
  if error is not None:
    return error
  if isinstance(e, PermissionError) or e.errno == errno.EROFS:
    why = "a read-only file system" if e.errno == errno.EROFS else "permission denied"
    return UserError(f"cannot {doing or 'access'} {name}: {why}; choose a path you can "
                     f"{'read' if doing == 'read' else 'write'}, or fix its permissions.")
  if isinstance(e, FileExistsError) and e.filename is not None and os.path.isdir(e.filename):
    return UserError(f"cannot {doing or 'use'} {name}: {e.filename} already exists; choose another path or "
                     "remove it.")
  if isinstance(e, (NotADirectoryError, FileExistsError)):  # (makedirs meets a file where a folder goes)
    return UserError(f"cannot {doing or 'use'} {name}: a part of the path is a file, not a folder; choose a path "
                     "under a folder.")
  if isinstance(e, IsADirectoryError):
    return UserError(f"cannot {doing or 'use'} {name}: it is a folder; name a file.")
  if isinstance(e, FileNotFoundError):
    return UserError(f"cannot {doing or 'use'} {name}: no such file or folder; check the path.")
  return UserError(f"cannot {doing or 'use'} {name}: {e.strerror or e}; check the path.")


def path_problem(e: BaseException) -> UserError | None:
  """The one-line UserError of an OSError on a named path (`path_error`), else None.

  The last resort of every entry point: a file that cannot be read or written
  is the user's to fix, whichever library call met it first.
  """
  inner = original(e)
  if not isinstance(inner, OSError) or inner.filename is None:
    return None
  return path_error(inner)


INTERRUPTED = "interrupted (Ctrl-C); nothing was left half-written"


def interrupted() -> int:
  """Exit status 130 (the shell's for SIGINT) with one line on stderr, for a Ctrl-C a command caught.

  Writers replace files atomically, so an interrupted command leaves nothing half-written.
  """
  print(INTERRUPTED, file=sys.stderr)
  # CPython (3.11, pythonrun.c run_eval_code_obj) marks a KeyboardInterrupt that leaves code run by
  # exec or eval of a *string* (dataclasses and namedtuple build their methods that way, e.g. while
  # flax imports) as unhandled, even when a caller catches it. Under `python -m` it then ends the
  # process by SIGINT at exit: status -2 instead of 130. Running string code again clears the mark.
  exec("")  # noqa: S102
  return 128 + signal.SIGINT


class Terminated(KeyboardInterrupt):
  """SIGTERM, raised by a driver's handler while it waits on its children (a KeyboardInterrupt, so that every
  clean-up that a Ctrl-C runs runs for it too); `run_command` ends it with 143 and one line."""


TERMINATED = "terminated (SIGTERM); nothing was left half-written"


def terminated() -> int:
  """Exit status 143 (the shell's for SIGTERM) with one line on stderr, for a SIGTERM a command took."""
  print(TERMINATED, file=sys.stderr)
  exec("")  # noqa: S102  (as in `interrupted`)
  return 128 + signal.SIGTERM


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
  """For the block, a SIGTERM (a scheduler's, `timeout`'s) raises `Terminated` where the main thread is, so
  the clean-up a Ctrl-C runs runs for it too (children stopped, staging folders removed); off the main
  thread, where no handler can be set, nothing changes. A block that takes SIGTERM itself (training's
  stop-after-the-step) sets its own handler inside and puts this one back."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return

  def raise_terminated(signum, frame):
    del signum, frame
    raise Terminated()

  previous = signal.signal(signal.SIGTERM, raise_terminated)
  try:
    yield
  finally:
    signal.signal(signal.SIGTERM, previous)


def run_command(work: Callable[[], Any]) -> int:
  """A command's exit status: 0 after `work()`, 2 with `error: <message>` on stderr for a UserError
  (or an OSError on a named path, `path_problem`), 130 with one line for Ctrl-C (`interrupted`), 143 with
  one line for a SIGTERM a driver took (`Terminated`)."""
  try:
    work()
  except UserError as e:
    return report(e)
  except Terminated:
    return terminated()
  except KeyboardInterrupt:
    return interrupted()
  except OSError as e:
    problem = path_problem(e)
    if problem is None:
      raise
    return report(problem)
  return 0


class ArgumentParser(argparse.ArgumentParser):
  """argparse with our error form: one `error: ...` line naming the flag and `--help`, exit status 2.

  (argparse's own form is a usage block and a `prog: error:` line.)
  """

  def error(self, message: str) -> NoReturn:
    print(f"error: {message}; see {self.prog} --help.", file=sys.stderr)
    sys.exit(2)

  def parse_known_args(self, args=None, namespace=None):
    """Also expands a leading `~` in every string value: a shell leaves `--output=~/x` as it is, and a
    command would otherwise create a folder named `~` where it runs (the checks expand it, the writes not)."""
    namespace, extras = super().parse_known_args(args, namespace)
    for name, value in vars(namespace).items():
      if isinstance(value, str) and value.startswith("~"):
        setattr(namespace, name, os.path.expanduser(value))
      elif isinstance(value, list) and any(isinstance(v, str) and v.startswith("~") for v in value):
        setattr(namespace, name, [os.path.expanduser(v) if isinstance(v, str) else v for v in value])
    return namespace, extras


class SettingError(UserError, ValueError):
  """A configuration value out of its allowed range (a UserError for entry points, a ValueError for callers)."""


# ---------------------------------------------------------------- Ctrl-C held or polled around a step that must
# not stop half way (a folder renamed into place, rows pulled through TensorFlow's native iterator)


@contextlib.contextmanager
def interrupts_held(*, deliver: bool = True) -> Iterator[None]:
  """Holds a Ctrl-C (SIGINT) that comes during the block until it ends: for steps that must not stop half way.

  Renaming a finished folder into place in two renames, or removing a
  temporary folder, stopped in the middle would lose the user's old copy or
  leave half a folder. A SIGINT that came is delivered when the block ends
  normally (`deliver`; the process's own handler: KeyboardInterrupt under
  Python's), and dropped when the block raised (it is already stopping).
  Outside the main thread (where signal handlers cannot be set) it holds nothing.
  """
  with _sigint_recorded(deliver=deliver):
    yield


# The open `interrupts_polled` block: (the SIGINTs it took and has not delivered, the handler it replaced).
_POLLED: list[tuple[list[int], Any]] = []


@contextlib.contextmanager
def interrupts_polled() -> Iterator[None]:
  """Takes a Ctrl-C (SIGINT) during the block only where its code calls `check_interrupt()`, and at its end.

  For code that drives a native library which calls back into Python. A
  KeyboardInterrupt raised inside such a callback is the library's to handle,
  and TensorFlow's iterator does not: `TFE_Py_FastPathExecute` calls
  `TensorShape.__len__`, and a Ctrl-C whose handler ran there was swallowed
  (`xalign cache` wrote on to the end), while a native caller that meets an
  exception it does not expect may crash (two of CI's interrupted writes died
  of SIGSEGV). Inside the block a SIGINT is only recorded; `check_interrupt()`
  delivers it to the handler the block replaced (KeyboardInterrupt under
  Python's), as does the block's end when it ends normally (one that raised
  is already stopping). Blocks nest: an inner one is the outer one. Outside
  the main thread it does nothing and `check_interrupt()` never raises.
  """
  if _POLLED:
    yield
    return
  with _sigint_recorded(deliver=True) as record:
    if record is None:
      yield
      return
    _POLLED.append(record)
    try:
      yield
    finally:
      _POLLED.pop()


@contextlib.contextmanager
def _sigint_recorded(*, deliver: bool) -> Iterator[tuple[list[int], Any] | None]:
  """SIGINT recorded instead of handled during the block: yields (the signals that came, the handler replaced).

  The handler is put back when the block ends, and a recorded SIGINT given to it when the block ended
  normally and `deliver`. Outside the main thread (signal handlers cannot be set there) it records
  nothing and yields None.
  """
  if threading.current_thread() is not threading.main_thread():
    yield None
    return
  came: list[int] = []
  previous = signal.signal(signal.SIGINT, lambda signum, frame: came.append(signum))
  try:
    yield came, previous
  finally:
    signal.signal(signal.SIGINT, previous)
  if came and deliver:
    _deliver_sigint(previous)


def check_interrupt() -> None:
  """Delivers a Ctrl-C the open `interrupts_polled` block took (KeyboardInterrupt under Python's handler)."""
  if _POLLED and _POLLED[-1][0]:
    came, previous = _POLLED[-1]
    came.clear()
    _deliver_sigint(previous)


def _deliver_sigint(previous: Any) -> None:
  """Gives a held SIGINT to `previous`, the handler that was in place: KeyboardInterrupt under Python's own."""
  if callable(previous):
    previous(signal.SIGINT, None)
  elif previous == signal.SIG_DFL:
    raise KeyboardInterrupt
