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


def test_a_failed_saves_folder_is_removed_even_while_late_writes_recreate_it(tmp_path):
  """CI left `3.orbax-checkpoint-tmp` behind a full disk: TensorStore's other writes of the failed save were
  still creating files when it was removed once. Here a writer keeps recreating the folder for 0.4 s."""
  import os
  import threading
  import time

  for finished in ("1", "2"):
    (tmp_path / finished).mkdir()
    (tmp_path / finished / "state").write_text(finished)
  stop = time.monotonic() + 0.4

  def late_writes():
    n = 0
    while time.monotonic() < stop:
      os.makedirs(tmp_path / "3.orbax-checkpoint-tmp-17" / "state", exist_ok=True)
      try:
        (tmp_path / "3.orbax-checkpoint-tmp-17" / "state" / f"chunk{n}").write_bytes(b"x")
      except FileNotFoundError:
        pass  # Removed between the two calls.
      n += 1
      time.sleep(0.01)

  writer = threading.Thread(target=late_writes)
  writer.start()
  time.sleep(0.05)
  checkpoint_noise.remove_failed_save(str(tmp_path), 3, settle_s=0.3)
  writer.join()
  assert sorted(os.listdir(tmp_path)) == ["1", "2"]
  assert [(tmp_path / s / "state").read_text() for s in ("1", "2")] == ["1", "2"]


def test_out_of_memory_is_seen_through_orbax_wrapping_and_nothing_else_is():
  assert checkpoint_noise.out_of_memory(ValueError("Encountered error while reading array index")) is False
  try:
    try:
      raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 11.09GiB")
    except RuntimeError as e:
      raise ValueError("Encountered error while reading array index") from e
  except ValueError as wrapped:
    assert checkpoint_noise.out_of_memory(wrapped)
