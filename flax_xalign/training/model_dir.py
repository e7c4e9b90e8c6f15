"""MODEL_DIR: the forms a user may give, and one writer at a time.

`check_model_dir` (defined with the layout in `flax_xalign/run_dir.py`) turns
what the user typed into the folder a run will use, or a UserError before
anything runs.

`lock` makes a run the only writer of its MODEL_DIR: two trainers on one
folder used to both exit 0 with their metrics interleaved and, with different
settings, two trajectories mixed in the checkpoints. The lock is
`fcntl.flock(LOCK_EX | LOCK_NB)` on the MODEL_DIR folder itself and on
MODEL_DIR/.lock, so the kernel releases it when the holder dies, however it
dies, and deleting .lock while a run trains does not free the folder (the
folder's own lock still holds); the holder writes who it is (pid, host, start
time, command) into .lock for the refusal message. The file stays after the
run: deleting it would race with a new run that has just opened it.
Where the file system has no flock (some network file systems answer ENOLCK or
EOPNOTSUPP) the owner record is the lock: held while its pid lives on this
host; a record left by a dead process on this host is stale and taken over
with a warning. On such a file system two runs started in the same instant
can still both get through, and a record of another host is never taken over.

In a bucket (MODEL_DIR=gs://...) there is no flock: MODEL_DIR/.lock is an
object created only where none exists, holding the owner record and a lease
the holder renews (`storage.BucketLock`); a run that died without a word is
taken over once its lease has run out (at once from its own host).
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import socket
import sys
from collections.abc import Iterator

from flax_xalign import storage
from flax_xalign.errors import UserError
from flax_xalign.fileio import makedirs
from flax_xalign.run_dir import RunDir, check_model_dir  # noqa: F401  (check_model_dir: this module's public name)

# Answers of flock on a file system without it: fall back to the owner record.
_NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL)


def _process_index() -> int:
  import jax

  return jax.process_index()


@contextlib.contextmanager
def lock(model_dir: str, *, process_index: int | None = None) -> Iterator[None]:
  """Holds MODEL_DIR/.lock for the body (process 0 only; the others only wait on process 0's checks).

  Creates `model_dir` when missing: take the lock right before the run's
  first write, after every check, so a refused run leaves nothing behind.

  Raises:
    UserError: another run holds the lock (naming its pid, host and start).
  """
  if (_process_index() if process_index is None else process_index) != 0:
    yield
    return
  if storage.is_url(model_dir):
    with _bucket_lock(model_dir):
      yield
    return
  makedirs(model_dir, setting="MODEL_DIR")
  path = RunDir.of(model_dir).lock
  folder_fd = os.open(model_dir, os.O_RDONLY | os.O_DIRECTORY)
  try:
    # The folder's own lock first: it holds even when someone deletes .lock under a running trainer.
    try:
      fcntl.flock(folder_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      raise _in_use(model_dir, _owner_of(path), flocked=True) from None
    except OSError as e:
      if e.errno not in _NO_FLOCK:
        raise
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        flocked = True
      except BlockingIOError:
        raise _in_use(model_dir, _read_owner(fd), flocked=True) from None
      except OSError as e:
        if e.errno not in _NO_FLOCK:
          raise
        flocked = False
        _claim_without_flock(model_dir, _read_owner(fd))
      _write_owner(fd)
      try:
        yield
      finally:
        os.ftruncate(fd, 0)  # A record without a holder would read as a stale lock where flock is missing.
        if flocked:
          fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
      os.close(fd)
  finally:
    os.close(folder_fd)  # Closing the folder's descriptor releases its lock.


@contextlib.contextmanager
def _bucket_lock(model_dir: str) -> Iterator[None]:
  held = storage.BucketLock(RunDir.of(model_dir).lock, _owner())
  try:
    before = held.acquire()
  except storage.LockHeld as e:
    raise _in_bucket_use(model_dir, e.owner, held.lease_s) from None
  if before and not before.get("released"):
    print(f"warning: MODEL_DIR {model_dir} was locked by pid {before.get('pid', '?')} on host "
          f"{before.get('host', '?')}, whose lease ran out (or which has ended); taking the lock over.",
          file=sys.stderr, flush=True)
  try:
    yield
  finally:
    held.release()


def _in_bucket_use(model_dir: str, owner: dict, lease_s: float) -> UserError:
  import time

  left = max(0, int(float(owner.get("lease_until", 0) or 0) - time.time()))
  return UserError(f"MODEL_DIR {model_dir} is in use by another run (pid {owner.get('pid', '?')} on host "
                   f"{owner.get('host', '?')}, since {owner.get('started', '?')}); wait for it to finish or stop "
                   f"it, or choose another MODEL_DIR. Its lease on {RunDir.of(model_dir).lock} is renewed while it "
                   f"runs; if it is gone, the lock is free in {left} s (the lease is {lease_s:.0f} s).")


def _owner_of(path: str) -> dict:
  """The owner record in the file at `path` ({} when it is gone or unreadable)."""
  try:
    fd = os.open(path, os.O_RDONLY)
  except OSError:
    return {}
  try:
    return _read_owner(fd)
  finally:
    os.close(fd)


def _read_owner(fd: int) -> dict:
  os.lseek(fd, 0, os.SEEK_SET)
  data = b""
  while chunk := os.read(fd, 65536):
    data += chunk
  try:
    owner = json.loads(data.decode("utf-8"))
  except (UnicodeDecodeError, ValueError):
    return {}
  return owner if isinstance(owner, dict) else {}


def _owner() -> dict:
  return {"pid": os.getpid(), "host": socket.gethostname(),
          "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
          "command": " ".join([os.path.basename(sys.executable), *sys.argv])}


def _write_owner(fd: int) -> None:
  owner = _owner()
  os.ftruncate(fd, 0)
  os.lseek(fd, 0, os.SEEK_SET)
  os.write(fd, (json.dumps(owner) + "\n").encode("utf-8"))


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # Someone else's process: alive.
    return True
  return True


def _claim_without_flock(model_dir: str, owner: dict) -> None:
  """Decides from the owner record alone (no flock here): free, stale (taken over), or in use."""
  pid = owner.get("pid")
  if not isinstance(pid, int) or isinstance(pid, bool):
    return
  if owner.get("host") != socket.gethostname() or _pid_alive(pid):
    raise _in_use(model_dir, owner, flocked=False)
  print(f"warning: MODEL_DIR {model_dir} was locked by pid {pid} on this host, which has ended; taking the "
        "lock over.", file=sys.stderr, flush=True)


def _in_use(model_dir: str, owner: dict, *, flocked: bool) -> UserError:
  """The refusal; only without flock (where a dead run's record stays a lock) is deleting .lock advised."""
  pid = owner.get("pid", "?")
  who = (f"pid {pid} on host {owner.get('host', '?')}, since {owner.get('started', '?')}" if owner
         else "its record in .lock was deleted")
  if flocked:
    advice = ("The lock is the kernel's: it is released the moment that run ends, however it ends, so there "
              "is no file to delete.")
  else:
    advice = (f"This file system has no flock: if that run is gone (e.g. it ran on another host of a network "
              f"file system), delete {RunDir.of(model_dir).lock} and rerun.")
  stop = f"stop it (kill {pid})" if owner else "stop it"
  return UserError(f"MODEL_DIR {model_dir} is in use by another run ({who}); wait for it to finish or {stop}, "
                   f"or choose another MODEL_DIR. {advice}")
