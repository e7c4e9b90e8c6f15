"""BatchFetcher: a stop request is heard while the input pipeline is busy (issue 14, item 1)."""

import io
import signal
import threading
import time

import pytest

from flax_xalign.training.batches import BatchFetcher, StopWhileFetching


class _Gate:
  """An iterator whose `next` blocks until `release()` (a pipeline filling its buffer)."""

  def __init__(self, items):
    self._items = iter(items)
    self._open = threading.Event()
    self.calls = 0

  def release(self):
    self._open.set()

  def __iter__(self):
    return self

  def __next__(self):
    self.calls += 1
    self._open.wait()
    return next(self._items)


def test_returns_converted_batches_in_order_then_stop_iteration():
  fetcher = BatchFetcher(iter([1, 2, 3]), should_stop=lambda: False, convert=lambda b: b * 10)
  assert [fetcher.next(), fetcher.next(), fetcher.next()] == [10, 20, 30]
  with pytest.raises(StopIteration):
    fetcher.next()
  assert fetcher.fetched == 3


def test_exceptions_of_the_iterator_come_through_unchanged():
  error = ValueError("bad record")

  def broken():
    yield 1
    raise error

  fetcher = BatchFetcher(broken(), should_stop=lambda: False)
  assert fetcher.next() == 1
  with pytest.raises(ValueError) as raised:
    fetcher.next()
  assert raised.value is error


def test_a_stop_requested_while_the_pipeline_blocks_is_seen_within_a_poll():
  gate = _Gate([7, 8])
  requested = []
  fetcher = BatchFetcher(gate, should_stop=lambda: bool(requested), poll_s=0.05)
  threading.Timer(0.3, lambda: requested.append(time.monotonic())).start()
  with pytest.raises(StopWhileFetching) as raised:
    fetcher.next()  # Without the worker thread this would block until release(): forever.
  seen = time.monotonic()
  assert seen - requested[0] < 0.5  # One poll (0.05 s) plus scheduling slack on a loaded machine.
  assert raised.value.waited_s >= 0.25
  # Going on after all: the fetch in flight is the one waited for, no batch is skipped or read twice.
  requested.clear()
  gate.release()
  assert fetcher.next() == 7 and fetcher.next() == 8 and gate.calls == 2


def test_a_signal_handler_runs_while_waiting_and_a_raising_one_aborts_at_once():
  gate = _Gate([1])
  fetcher = BatchFetcher(gate, should_stop=lambda: False, poll_s=0.2)

  def second_ctrl_c(signum, frame):
    raise KeyboardInterrupt

  previous = signal.signal(signal.SIGALRM, second_ctrl_c)
  try:
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
      fetcher.next()
    assert time.monotonic() - start < 1.0
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)
    gate.release()


def test_long_waits_print_progress_lines():
  gate = _Gate([1, 2])
  out = io.StringIO()
  fetcher = BatchFetcher(gate, should_stop=lambda: False, poll_s=0.02, first_report_s=0.1,
                         report_every_s=0.2, stream=out)
  threading.Timer(0.45, gate.release).start()
  assert fetcher.next() == 1
  lines = out.getvalue().splitlines()
  # Reports at about 0.1 s and 0.3 s (later ones only if the machine is slow); the batch comes at 0.45 s.
  assert len(lines) >= 2, lines
  assert all(line.startswith("waiting for the input pipeline (first batch: filling the shuffle buffer)... ")
             and line.endswith(" s") for line in lines)
  assert fetcher.next() == 2 and out.getvalue().count("\n") == len(lines)  # A fast batch prints nothing.


def test_a_stuck_fetch_does_not_keep_the_process_alive():
  gate = _Gate([])
  fetcher = BatchFetcher(gate, should_stop=lambda: True, poll_s=0.01)
  with pytest.raises(StopWhileFetching):
    fetcher.next()
  worker = [t for t in threading.enumerate() if t.name == "BatchFetcher"]
  assert worker and all(t.daemon for t in worker)
  gate.release()


def test_a_tf_data_pipeline_blocked_in_cpp_can_be_stopped():
  # A pipeline busy inside TensorFlow's C++ code (filling a shuffle buffer, or searching forever for a
  # non-empty example): here a map blocked on a queue, released at the end so no thread is left behind.
  tf = pytest.importorskip("tensorflow")
  queue = tf.queue.FIFOQueue(1, tf.int64)
  blocked = tf.data.Dataset.range(1).map(lambda x: queue.dequeue() + x)
  deadline = time.monotonic() + 0.3
  fetcher = BatchFetcher(iter(blocked), should_stop=lambda: time.monotonic() > deadline, poll_s=0.05)
  with pytest.raises(StopWhileFetching):
    fetcher.next()
  assert time.monotonic() - deadline < 1.0
  queue.enqueue(tf.constant(4, tf.int64))
  assert int(fetcher.next()) == 4
