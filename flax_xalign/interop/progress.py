"""Timed progress lines for the import/export commands: one line per stage."""

from __future__ import annotations

import time
from typing import Callable


class Progress:
  """Each `step` prints `<prefix>: <message> (<seconds since the previous step> s)`.

  Attributes:
    seconds: stage name -> seconds it took.
    start: when the first stage began (`time.perf_counter()`).
  """

  def __init__(self, prefix: str, log: Callable[[str], None] = print):
    self.prefix, self.log, self.seconds = prefix, log, {}
    self.start = self.last = time.perf_counter()

  def step(self, name: str, message: str) -> None:
    now = time.perf_counter()
    self.seconds[name] = now - self.last
    self.last = now
    self.log(f"{self.prefix}: {message} ({self.seconds[name]:.1f} s)")

  def total(self) -> float:
    return time.perf_counter() - self.start
