"""Fetching train batches so that a stop request is heard while the input pipeline is busy.

    fetcher = BatchFetcher(train_iterator, should_stop=lambda: stop.signal is not None,
                           convert=_to_host)
    host_batch = fetcher.next()  # StopWhileFetching if a stop comes in meanwhile.

`next(iterator)` on a tf.data iterator blocks in C++ for as long as the
pipeline needs: filling a shuffle buffer, tokenising long lines, reading a
slow disk. Python runs signal handlers only between bytecodes of the main
thread, so a SIGTERM or Ctrl-C waited for the next batch: minutes, or
forever on a pipeline that never yields. Here the fetch runs in a worker
thread while the main thread waits on it in slices of at most `poll_s`
(0.2 s), asking `should_stop()` after each; signal handlers run in between
(and a handler that raises, as a second Ctrl-C does, aborts the wait at once).
While waiting longer than `first_report_s` it prints a progress line every
`report_every_s`.

One fetch is in flight at a time and nothing is fetched ahead, so between
`next()` calls the iterator is idle and can be checkpointed. After
`StopWhileFetching` the worker may still be inside `next(iterator)`: the
iterator is mid-read and must not be saved; the worker is a daemon thread,
so it does not keep the process alive. A later `next()` (if the caller
decides to go on) waits for that same fetch rather than starting another, so
no batch is lost or read twice.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO


class StopWhileFetching(Exception):
  """A stop was requested while waiting for a batch; the iterator is mid-read.

  Attributes:
    waited_s: seconds spent waiting for the batch before the stop was seen.
  """

  def __init__(self, waited_s: float):
    super().__init__(f"stop requested while waiting {waited_s:.1f} s for the input pipeline")
    self.waited_s = waited_s


class _Fetch:
  """One `next(iterator)` running in a daemon thread; `outcome` is set when it ends."""

  def __init__(self, iterator: Iterator[Any], convert: Callable[[Any], Any] | None):
    self.done = threading.Event()
    self.outcome: tuple[bool, Any] | None = None  # (ok, batch) or (False, exception)
    self._iterator, self._convert = iterator, convert
    threading.Thread(target=self._run, name="BatchFetcher", daemon=True).start()

  def _run(self) -> None:
    try:
      batch = next(self._iterator)
      self.outcome = (True, batch if self._convert is None else self._convert(batch))
    except BaseException as e:  # noqa: BLE001 -- handed to the caller's thread as it is (StopIteration too).
      self.outcome = (False, e)
    finally:
      self.done.set()


class BatchFetcher:
  """Fetches batches of an iterator in a worker thread, polling a stop predicate meanwhile.

  Attributes:
    fetched: batches returned so far.
  """

  def __init__(self, iterator: Iterator[Any], *, should_stop: Callable[[], bool],
               convert: Callable[[Any], Any] | None = None, poll_s: float = 0.2,
               first_report_s: float = 5.0, report_every_s: float = 10.0,
               stream: TextIO | None = None):
    """Wraps `iterator`.

    Args:
      iterator: the batch iterator (a tf.data iterator; anything with `next`).
      should_stop: asked every `poll_s` while waiting; True ends the wait with
        `StopWhileFetching`. A batch that has arrived is returned even when a
        stop came in meanwhile (the loop then saves after its step).
      convert: applied to each batch in the worker (e.g. to NumPy arrays),
        so the conversion is waited on, and interruptible, the same way.
      poll_s: longest stretch between two checks of `should_stop` (and two
        chances for signal handlers to run).
      first_report_s: waits longer than this print a progress line ...
      report_every_s: ... and another one every `report_every_s` after it.
      stream: where progress lines go; None: `sys.stdout` at print time.
    """
    if not poll_s > 0 or not first_report_s >= 0 or not report_every_s > 0:
      raise ValueError(f"BatchFetcher needs poll_s > 0, first_report_s >= 0 and report_every_s > 0; got "
                       f"{poll_s}, {first_report_s}, {report_every_s}.")
    self._iterator = iterator
    self._should_stop = should_stop
    self._convert = convert
    self._poll_s = poll_s
    self._first_report_s = first_report_s
    self._report_every_s = report_every_s
    self._stream = stream
    self._pending: _Fetch | None = None
    self.fetched = 0

  def _what(self) -> str:
    return "first batch: filling the shuffle buffer" if self.fetched == 0 else "next batch"

  def next(self) -> Any:
    """The next batch (converted).

    Raises:
      StopWhileFetching: `should_stop()` became true before the batch came.
      StopIteration: the iterator is exhausted (as the iterator raised it).
      Exception: whatever the iterator (or `convert`) raised, unchanged.
    """
    if self._pending is None:
      self._pending = _Fetch(self._iterator, self._convert)
    fetch = self._pending
    start = time.monotonic()
    report_at = self._first_report_s
    while not fetch.done.wait(self._poll_s):
      waited = time.monotonic() - start
      if self._should_stop():
        raise StopWhileFetching(waited)
      if waited >= report_at:
        print(f"waiting for the input pipeline ({self._what()})... {waited:.0f} s",
              file=self._stream or sys.stdout, flush=True)
        report_at += self._report_every_s
    self._pending = None
    ok, value = fetch.outcome
    if not ok:
      raise value
    self.fetched += 1
    return value

  __next__ = next

  def __iter__(self) -> BatchFetcher:
    return self
