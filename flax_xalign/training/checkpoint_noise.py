"""What Orbax prints around a failed checkpoint read or write, and the hooks that drop it.

Two Orbax behaviours bury our one-line reports under tracebacks:

* a save that fails for lack of space is logged by Orbax (through absl) with
  its whole traceback, before `Checkpointer` turns it into one UserError;
* a restore of a damaged state raises at the first unreadable array and
  closes its event loop while the other arrays' reads are still in flight;
  as they finish, each prints a traceback ("Task exception was never
  retrieved", "Exception ignored in: <coroutine ...>", "Event loop is
  closed"): hundreds of lines around our one warning line.

`install()` adds logging filters and wraps `sys.excepthook` and
`sys.unraisablehook` so that exactly those are dropped and everything else is
reported as before. It changes the whole process, so no library module calls
it: the command-line process set-up does (`flax_xalign.cli.setup_process`),
and so does the test suite's conftest. Only the standard library is imported
here, so the set-up of a command that never checkpoints stays cheap.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import time
from typing import Any

from flax_xalign.errors import NO_SPACE_ERRNOS, UserError

_installed = False


def _chain(error: BaseException | None):
  """`error`, then each exception it was raised from or during (each once: a chain may loop)."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    yield error
    error = error.__cause__ or error.__context__


def disk_full(error: BaseException | None) -> bool:
  """Whether `error` or one it was raised from is ENOSPC/EFBIG/EDQUOT (also as text: TF and TensorStore)."""
  return any((isinstance(e, OSError) and e.errno in NO_SPACE_ERRNOS)
             or any(os.strerror(code) in str(e) for code in NO_SPACE_ERRNOS) for e in _chain(error))


def no_space_reason(error: BaseException | None) -> str:
  """What `disk_full` found, in the system's words ('No space left on device'), for a line of our own."""
  for e in _chain(error):
    for code in NO_SPACE_ERRNOS:
      if (isinstance(e, OSError) and e.errno == code) or os.strerror(code) in str(e):
        return os.strerror(code)
  return os.strerror(NO_SPACE_ERRNOS[0])


def out_of_memory(error: BaseException | None) -> bool:
  """Whether `error` or one it was raised from is XLA's out-of-memory (also wrapped by Orbax or TensorStore)."""
  return any("RESOURCE_EXHAUSTED" in str(e) or "Out of memory while trying to allocate" in str(e)
             for e in _chain(error))


def store_unreachable(error: BaseException | None) -> bool:
  """Whether `error` or one it was raised from is an object store that could not be reached: TensorStore's
  spent retries, a refused or failed connection of gcsfs (aiohttp) or google-cloud-storage (requests)."""
  for e in _chain(error):
    text = str(e)
    if isinstance(e, ConnectionError) or "retry attempts failed" in text or "CURL error" in text:
      return True
    if type(e).__name__ in ("ClientConnectorError", "ServerDisconnectedError", "ClientOSError",
                            "ConnectionError", "RetryError", "ServiceUnavailable"):
      return True
  return False


def store_error(directory: Any, why: str) -> UserError:
  """The one line for a checkpoint save into a bucket that failed because the store went away (`why`)."""
  return UserError(f"could not write a checkpoint to {directory} ({why}): the store could not be reached or "
                   "refused the write. A step in a bucket counts only once its commit_success.txt is written, so "
                   "the steps before it are intact; rerun the same command once the store is back and it resumes "
                   "from the newest complete step.")


def remove_failed_save(directory: str, step: int, *, settle_s: float = 0.5, limit_s: float = 20.0) -> None:
  """Removes `directory`'s temporary folder of step `step`, whose save failed.

  The first write to fail raises while TensorStore's other writes of the same save may still be running,
  creating files and folders as they go: a single rmtree left the folder behind in CI. So it is removed
  until it has stayed absent for `settle_s` (at most `limit_s`)."""
  from flax_xalign import storage

  if storage.is_url(directory):
    # In a bucket Orbax writes the step in place and marks it finished with commit_success.txt last:
    # a failed save is a step folder without that marker (never a finished step).
    step_dir = storage.join(directory, str(step))
    if not storage.exists(storage.join(step_dir, "commit_success.txt")):
      with contextlib.suppress(FileNotFoundError):
        storage.rmtree(step_dir)
    return
  prefix = f"{step}.orbax-checkpoint-tmp"
  deadline, absent_since = time.monotonic() + limit_s, None
  while time.monotonic() < deadline:
    found = [name for name in os.listdir(directory) if name.startswith(prefix)]
    for name in found:
      shutil.rmtree(os.path.join(directory, name), ignore_errors=True)
    now = time.monotonic()
    if found:
      absent_since = None
    elif absent_since is None:
      absent_since = now
    elif now - absent_since >= settle_s:
      return
    time.sleep(0.05)


def bound_store_retries() -> None:
  """TensorStore's retries of a failed GCS request, from FLAX_XALIGN_STORE_RETRIES (unset: TensorStore's own
  32, backing off to 32 s: about a quarter of an hour of outage before a save fails).

  Orbax builds every TensorStore context from the two module-level dicts set here (its
  `tensorstore_utils.get_ts_context`); TensorStore's own context resource `gcs_request_retries` bounds the
  retries of each request, so a store that stays away ends the save with an error instead of retrying on.
  """
  value = os.environ.get("FLAX_XALIGN_STORE_RETRIES")
  if not value:
    return
  try:
    retries = int(value)
    if retries < 0:
      raise ValueError
  except ValueError:
    raise UserError(f"FLAX_XALIGN_STORE_RETRIES={value!r} is not a count of retries; give e.g. 8, or unset it."
                    ) from None
  from orbax.checkpoint._src.serialization import tensorstore_utils as ts_utils

  setting = {"max_retries": retries, "initial_delay": "0.5s", "max_delay": "8s"}
  for context in (ts_utils._BASE_TS_CONTEXT, ts_utils._DEFAULT_OCDBT_TS_CONTEXT):  # pylint: disable=protected-access
    context["gcs_request_retries"] = setting


class DiskFullLogFilter(logging.Filter):
  """Drops Orbax's logged traceback of a save that failed for lack of space or because the bucket could not
  be reached: `Checkpointer` reports either, once."""

  def filter(self, record: logging.LogRecord) -> bool:
    error = record.exc_info[1] if record.exc_info else None
    return error is None or not (disk_full(error) or store_unreachable(error))


def from_orbax_reads(tb: Any) -> bool:
  """Whether a traceback passes through Orbax's array reading or asyncio's closed-loop check."""
  while tb is not None:
    name = tb.tb_frame.f_code.co_filename.replace(os.sep, "/")
    if "orbax/checkpoint" in name or (name.endswith("asyncio/base_events.py")
                                      and tb.tb_frame.f_code.co_name in ("call_soon_threadsafe", "_check_closed")):
      return True
    tb = tb.tb_next
  return False


class AbandonedReadNoise(logging.Filter):
  """Drops asyncio's "Task exception was never retrieved" for the sibling reads of a failed Orbax restore."""

  def filter(self, record: logging.LogRecord) -> bool:
    if not str(record.msg).startswith("Task exception was never retrieved"):
      return True
    return not (record.exc_info and from_orbax_reads(record.exc_info[2]))


def install() -> None:
  """Installs the filters and the two hooks, once per process (later calls do nothing).

  The hooks wrap whatever `sys.excepthook` / `sys.unraisablehook` are at the
  time of the first call and pass on everything that is not Orbax read noise.
  """
  global _installed
  if _installed:
    return
  _installed = True
  logging.getLogger("absl").addFilter(DiskFullLogFilter())
  logging.getLogger("gcsfs").addFilter(DiskFullLogFilter())  # "out of retries", with a traceback: reported once
  logging.getLogger("asyncio").addFilter(AbandonedReadNoise())
  unraisable, excepthook = sys.unraisablehook, sys.excepthook

  def quiet_unraisable(info: Any) -> None:
    code = getattr(info.object, "cr_code", None)
    if (code is not None and "orbax/checkpoint" in code.co_filename.replace(os.sep, "/")) or (
        from_orbax_reads(info.exc_traceback) and isinstance(info.exc_value, (RuntimeError, Exception))):
      return
    unraisable(info)

  def quiet_excepthook(kind: type, value: BaseException, tb: Any) -> None:
    if isinstance(value, RuntimeError) and str(value) == "Event loop is closed" and from_orbax_reads(tb):
      return
    excepthook(kind, value, tb)

  sys.unraisablehook, sys.excepthook = quiet_unraisable, quiet_excepthook
