"""A failed restore of a damaged state leaves no tracebacks behind (issue 14, item 5; contract C2).

Orbax closes its event loop when the first array read fails; the other reads
then finished with tracebacks printed by asyncio's logger, the unraisable hook
and the excepthook (hundreds of lines around the one warning line, seen on a
truncated OCDBT data file). The hooks drop exactly those and nothing else.
`checkpoint_noise.install()` puts them in place; the command-line process
set-up calls it (tests/cli/test_process.py checks that a plain import does not).
"""

import logging
import sys
import types

import pytest

from flax_xalign.training import checkpoint_noise


def _raised_in(filename, message="Encountered error while reading array index"):
  """(exception, traceback) raised by code whose file is `filename` (as Orbax's or ours)."""
  namespace = {}
  exec(compile(f"def fail():\n  raise Exception({message!r})\n", filename, "exec"), namespace)  # noqa: S102
  try:
    namespace["fail"]()
  except Exception as e:  # noqa: BLE001
    return e, e.__traceback__
  raise AssertionError("unreachable")


ORBAX = "/site-packages/orbax/checkpoint/_src/serialization/serialization.py"
OURS = "/work/my_project/my_module.py"


@pytest.fixture
def hooks(monkeypatch):
  printed = []
  monkeypatch.setattr(sys, "unraisablehook", lambda info: printed.append(("unraisable", info.exc_value)))
  monkeypatch.setattr(sys, "excepthook", lambda kind, value, tb: printed.append(("excepthook", value)))
  monkeypatch.setattr(checkpoint_noise, "_installed", False)
  asyncio_logger, absl_logger = logging.getLogger("asyncio"), logging.getLogger("absl")
  before, absl_before = list(asyncio_logger.filters), list(absl_logger.filters)
  checkpoint_noise.install()
  checkpoint_noise.install()  # Installed once: the second call adds nothing.
  yield printed, [f for f in asyncio_logger.filters if f not in before]
  asyncio_logger.filters[:] = before
  absl_logger.filters[:] = absl_before


def test_noise_of_abandoned_orbax_reads_is_dropped_and_other_errors_kept(hooks):
  printed, new_filters = hooks
  assert len(new_filters) == 1
  noise_filter = new_filters[0]

  def record(origin):
    error, tb = _raised_in(origin)
    return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, "Task exception was never retrieved", (),
                             (type(error), error, tb))

  assert not noise_filter.filter(record(ORBAX))
  assert noise_filter.filter(record(OURS))
  assert noise_filter.filter(logging.LogRecord("asyncio", logging.ERROR, __file__, 1, "another message", (), None))

  def unraisable(origin):
    error, tb = _raised_in(origin)
    return types.SimpleNamespace(exc_type=type(error), exc_value=error, exc_traceback=tb, err_msg=None,
                                 object=None)

  sys.unraisablehook(unraisable(ORBAX))
  sys.unraisablehook(unraisable(OURS))
  closed, closed_tb = _raised_in(ORBAX, "Event loop is closed")
  closed = RuntimeError(str(closed))
  sys.excepthook(RuntimeError, closed, closed_tb)
  other = RuntimeError("Event loop is closed")
  sys.excepthook(RuntimeError, other, _raised_in(OURS)[1])
  assert [(where, str(value)) for where, value in printed] == [
      ("unraisable", "Encountered error while reading array index"), ("excepthook", "Event loop is closed")]


def test_disk_full_log_records_are_dropped_and_others_kept():
  import errno
  import os

  noise_filter = checkpoint_noise.DiskFullLogFilter()

  def record(error):
    return logging.LogRecord("absl", logging.ERROR, __file__, 1, "save failed", (),
                             (type(error), error, None) if error else None)

  full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
  wrapped = RuntimeError("write failed")
  wrapped.__cause__ = full
  assert not noise_filter.filter(record(full)) and not noise_filter.filter(record(wrapped))
  assert noise_filter.filter(record(OSError(errno.EACCES, os.strerror(errno.EACCES))))
  assert noise_filter.filter(record(None))
