"""One writer per run in a bucket (`storage.BucketLock`), against a real GCS server on 127.0.0.1 (tests/gcs.py)."""

import os
import time

import pytest

from flax_xalign import storage
from flax_xalign.errors import UserError

pytestmark = pytest.mark.contract


@pytest.fixture
def fences(monkeypatch):
  monkeypatch.setattr(storage, "_FENCED", {})
  monkeypatch.setenv("FLAX_XALIGN_LOCK_LEASE_S", "1")  # (the floor: renewed every third of a second)
  return storage._FENCED


def _owner(pid, host="this-host"):
  return {"pid": pid, "host": host, "command": "test"}


def test_a_second_writer_is_refused_until_the_first_releases(gcs, fences):
  first = storage.BucketLock("gs://bucket/lock1/.lock", _owner(os.getpid()))
  assert first.acquire() == {}
  second = storage.BucketLock("gs://bucket/lock1/.lock", _owner(1, "elsewhere"))
  with pytest.raises(storage.LockHeld) as held:
    second.acquire()
  assert held.value.owner["pid"] == os.getpid()
  first.release()
  assert second.acquire()["released"] is True
  second.release()


def test_a_writer_whose_lock_was_taken_over_writes_nothing_more_under_its_run(gcs, fences, capsys):
  """A holder that stalled past its lease (here: its renewals stopped) and was taken over must not go on
  writing the run beside the new holder: its next write under the run is one error naming the new holder."""
  stalled = storage.BucketLock("gs://bucket/run_t/.lock", _owner(os.getpid()))
  stalled.acquire()
  storage.write_object("gs://bucket/run_t/metrics.jsonl", b'{"step": 1}\n')
  stalled._stop.set()  # The stall: no renewal for longer than the lease.
  stalled._thread.join()
  time.sleep(1.2)
  newcomer = storage.BucketLock("gs://bucket/run_t/.lock", _owner(4242, "other-host"))
  assert newcomer.acquire()["pid"] == os.getpid()  # (the stale record, taken over)
  stalled._start_renewing()  # The stalled process wakes up: its next renewal finds the lock gone.
  deadline = time.monotonic() + 10
  while not stalled.lost and time.monotonic() < deadline:
    time.sleep(0.05)
  assert "taken over by pid 4242 on host other-host" in stalled.lost
  for write in (lambda: storage.write_object("gs://bucket/run_t/metrics.jsonl", b"late\n"),
                lambda: storage.append_object("gs://bucket/run_t/metrics.jsonl", b"late\n"),
                lambda: storage.remove("gs://bucket/run_t/checkpoints/1/x")):
    with pytest.raises(UserError, match="taken over by pid 4242.*stopped writing there"):
      write()
  assert gcs.read("bucket", "run_t/metrics.jsonl") == b'{"step": 1}\n'
  storage.write_object("gs://bucket/run_tt/other.txt", b"x")  # (a neighbour's name is not under the run)
  stalled.release()  # Writes no released record over the newcomer's.
  assert storage.BucketLock("gs://bucket/run_t/.lock", {})._read()[0]["pid"] == 4242
  assert "this run stops at its next write" in capsys.readouterr().err
  newcomer.release()


def test_the_checkpoint_hook_stops_before_saving_into_a_fenced_run(fences):
  from flax_xalign.training import hooks

  class Checkpointer:
    directory = "gs://bucket/run_f/checkpoints"

    def save(self, *args, **kwargs):
      raise AssertionError("saved into a run whose lock was taken over")

  fences["gs://bucket/run_f"] = "gs://bucket/run_f was taken over by pid 7"
  saver = hooks.CheckpointSaver(Checkpointer(), None, None, None, None, last_saved=None)
  with pytest.raises(UserError, match="taken over by pid 7"):
    saver(None)
