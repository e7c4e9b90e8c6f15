"""The child processes of the host's runner (`runner`): every trainer and scorer, none outliving the driver
(R04-R26).

`Children` starts each one in a session of its own under the --launcher, and stops them all when the driver
gets SIGTERM, SIGINT or SIGHUP or ends: SIGTERM first (a trainer saves its step), SIGKILL to the group after
STOP_GRACE_S. `RowRun` is one row of the bundle (`bundle.Row`) as it runs: its trainer (`python -m
flax_xalign.train`, SIGTERM at its deadline), then its scorer (`python -m flax_xalign.cli.gpu_run BUNDLE --score
MODEL_DIR`, which calls `runner.score_run`), which writes MODEL_DIR/scores.json.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from flax_xalign.experiments.gpu.bundle import Row

SCORE_FILE = "scores.json"
TRAIN_MODULE = "flax_xalign.train"  # (python -m): the trainer, t5x-style gin flags
SCORE_MODULE = "flax_xalign.cli.gpu_run"  # (python -m) BUNDLE --score MODEL_DIR --metrics=...: one row's scorer


def _python() -> list[str]:
  return [sys.executable]


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
STOP_GRACE_S = 15.0  # after SIGTERM, a trainer's time to save its step before it is SIGKILLed


def _signal(pid: int, signum: int, *, group: bool) -> None:
  with contextlib.suppress(ProcessLookupError, PermissionError):  # (gone already)
    (os.killpg if group else os.kill)(pid, signum)


class Children:
  """The driver's child processes (trainers, scorers), each in a session of its own: no terminal signal reaches
  one behind the driver's back, and SIGKILL to its group ends whatever it started.

  On SIGTERM, SIGINT or SIGHUP to the driver (`on_signals`), and when the driver ends (`close`), no new child
  starts and every running one gets SIGTERM (a trainer saves its step and exits); what is left after
  STOP_GRACE_S, or at a second signal, is SIGKILLed with its group. The thread that started a child reaps it
  (`wait`), and SIGKILLs whatever of its group outlived it.
  """

  def __init__(self, launcher: Sequence[str] = ()):
    self.launcher = list(launcher)  # The command every child runs under (`--launcher`).
    self.stopped_by: int | None = None  # The signal that stopped the driver.
    self._live: dict[int, subprocess.Popen] = {}
    self._lock = threading.Lock()
    # Plain flags, no Event: the signal handler runs in the main thread, which may hold any lock just then.
    self._closing = self._at_once = False
    self._stopper = threading.Thread(target=self._stop_all, name="gpu_run-stop", daemon=True)
    self._stopper.start()

  @property
  def stopping(self) -> bool:
    return self.stopped_by is not None or self._closing

  def start(self, argv: Sequence[str], *, log: str, env: Mapping[str, str]) -> subprocess.Popen | None:
    """A child running `argv` under the launcher, its output appended to `log`; None once stopping."""
    with self._lock:  # (`_stop_all` signals every child registered here: none can start unseen)
      if self.stopping:
        return None
      with open(log, "a", encoding="utf-8") as out:
        child = subprocess.Popen([*self.launcher, *argv], stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=subprocess.STDOUT, env=dict(env), start_new_session=True)
      self._live[child.pid] = child
    return child

  def wait(self, child: subprocess.Popen, *, deadline: float | None = None) -> tuple[int, bool]:
    """(exit status, whether it got SIGTERM at `deadline`, time.monotonic) of `child`, reaped."""
    termed = False
    while True:
      try:
        code = child.wait(timeout=0.5)
        break
      except subprocess.TimeoutExpired:
        if deadline is not None and not termed and time.monotonic() > deadline:
          _signal(child.pid, signal.SIGTERM, group=False)
          termed = True
    with self._lock:
      self._live.pop(child.pid, None)
    _signal(child.pid, signal.SIGKILL, group=True)  # What it started and left behind.
    return code, termed

  @contextlib.contextmanager
  def on_signals(self):
    """SIGTERM, SIGINT and SIGHUP stop the children for the block (the first one is `stopped_by`)."""
    if threading.current_thread() is not threading.main_thread():
      yield self
      return
    previous = {s: signal.signal(s, self._signalled) for s in STOP_SIGNALS}
    try:
      yield self
    finally:
      for s, handler in previous.items():
        signal.signal(s, handler)

  def _signalled(self, signum: int, frame: Any) -> None:
    del frame
    if self.stopped_by is None:
      self.stopped_by = signum
    else:  # A second signal: no more waiting for saves.
      self._at_once = True

  def close(self) -> None:
    """Stops what still runs (nothing, after a whole grid) and returns once every child got its signals."""
    self._closing = True
    self._stopper.join()

  def _stop_all(self) -> None:
    while not self.stopping:
      time.sleep(0.1)
    with self._lock:
      for child in self._live.values():
        _signal(child.pid, signal.SIGTERM, group=False)
    end = time.monotonic() + STOP_GRACE_S
    while not self._at_once and time.monotonic() < end:
      with self._lock:
        if not self._live:
          return
      time.sleep(0.1)
    with self._lock:
      for child in self._live.values():
        _signal(child.pid, signal.SIGKILL, group=True)


def _read_scores(path: str) -> dict[str, Any]:
  """A scorer's scores.json, or the row's error when it is not a JSON object."""
  try:
    with open(path, encoding="utf-8") as f:
      scores = json.load(f)
  except (OSError, ValueError) as e:
    return {"error": f"scoring wrote a damaged {SCORE_FILE} ({e})"}
  return scores if isinstance(scores, dict) else {"error": f"scoring wrote a {SCORE_FILE} that is no JSON object"}


class RowRun:
  """One row: train (SIGTERM at its deadline), then score in a process of its own; `row`: its results.json row."""

  def __init__(self, spec: Row, *, work: str, children: Children):
    self.spec = spec
    self.name = spec.name
    self.model_dir = os.path.join(work, "runs", self.name)
    self.children = children
    self.row: dict[str, Any] = {"name": self.name, "family": spec.family, "objective": spec.objective,
                                "seed": spec.seed, "start": spec.start}

  def train(self, argv: Sequence[str], *, deadline: float, log: str, env: Mapping[str, str]) -> int | None:
    """Runs the trainer; at `deadline` (time.monotonic) it gets SIGTERM and saves. Returns its exit status (None:
    not started, the driver is stopping)."""
    start = time.monotonic()
    child = self.children.start([*_python(), "-m", TRAIN_MODULE, *argv], log=log, env=env)
    if child is None:
      return None
    code, stopped = self.children.wait(child, deadline=deadline)
    self.row["train_s"] = round(time.monotonic() - start, 1)
    self.row["stopped_early"] = stopped
    return code

  def score(self, bundle_dir: str, metrics: Sequence[str], *, log: str, env: Mapping[str, str]) -> int | None:
    start = time.monotonic()
    path = os.path.join(self.model_dir, SCORE_FILE)
    with contextlib.suppress(FileNotFoundError):  # An earlier call's scores are never taken for this one's.
      os.remove(path)
    child = self.children.start([*_python(), "-m", SCORE_MODULE, bundle_dir, "--score",
                                 self.model_dir, f"--metrics={','.join(metrics)}"], log=log, env=env)
    if child is None:
      return None
    code, _ = self.children.wait(child)
    self.row["score_s"] = round(time.monotonic() - start, 1)
    if code == 0 and os.path.isfile(path):
      self.row["scores"] = _read_scores(path)
    return code
