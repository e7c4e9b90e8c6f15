"""One configuration of a step-cost benchmark: a Trainer, its state and sharded batches.

Shared by bench/dwa_overhead.py, bench/code_switch_step.py and bench/gc_step.py, which time
several objective sets on the same batches in interleaved rounds. Run as
scripts, those files find this one on sys.path (the script's folder).
"""

from __future__ import annotations

import time
from typing import Any


class Side:
  """A named Trainer stepping through `batches` (sharded once), timed or FLOP-counted."""

  def __init__(self, name: str, trainer: Any, batches: list[dict]):
    import jax

    self.name = name
    self.trainer = trainer
    self.state = trainer.init_state()
    with trainer.mesh_context():
      self.batches = [trainer.shard(b) for b in batches]
    self.index = 0
    self._jax = jax

  def step(self) -> None:
    with self.trainer.mesh_context():
      batch = self.batches[self.index % len(self.batches)]
      self.index += 1
      self.state, metrics = self.trainer.train_step(self.state, batch, self.trainer.base_rng,
                                                    self.trainer.assets.device)
    self._jax.block_until_ready(metrics["loss"])
    self.last_metrics = metrics

  def flops(self) -> float | None:
    """XLA's cost-analysis FLOPs of the compiled step (a noise-free companion of the timings)."""
    try:
      with self.trainer.mesh_context():
        compiled = self.trainer.train_step.lower(self.state, self.batches[0], self.trainer.base_rng,
                                                 self.trainer.assets.device).compile()
      cost = compiled.cost_analysis()
      cost = cost[0] if isinstance(cost, (list, tuple)) else cost
      return float(cost["flops"])
    except Exception:  # noqa: BLE001  (a backend without cost analysis)
      return None

  def timed(self, steps: int) -> float:
    """Seconds per step over `steps` steps, after one warm-up step (the first call compiles)."""
    self.step()
    start = time.perf_counter()
    for _ in range(steps):
      self.step()
    return (time.perf_counter() - start) / steps


def print_ratio_table(mlm_ms: float, sides: list[tuple[str, float, float, float]]) -> None:
  """The readable table of a step-cost bench: MLM, then (label, ms, ratio over MLM, target ratio) per side."""
  print()
  print(f"{'configuration':<16}{'ms / step':>12}{'x MLM':>8}{'target':>10}")
  print(f"{'MLM':<16}{mlm_ms:>12.1f}{1.0:>8.2f}")
  for label, ms, ratio, target in sides:
    verdict = "met" if ratio <= target else "NOT met"
    print(f"{label:<16}{ms:>12.1f}{ratio:>8.2f}{'<= ' + str(target):>10}  {verdict}")


def write_result(path: str, result: dict[str, Any]) -> None:
  """Saves the bench's JSON summary to `path` and prints it as the last line (the bench contract)."""
  import json
  import os

  from flax_xalign import fileio

  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fileio.write_atomically(path, json.dumps(result, indent=2))
  print(json.dumps(result))
