"""AdamW with linear warmup and linear decay, clipping and a decay mask.

Weight decay skips LayerNorm scales and every bias: the BERT/XLM-R convention,
since decaying a scale toward zero fights normalisation. The mask goes by
parameter name, not rank, because scanned layers stack a LayerNorm scale into a
[layers, embed] matrix.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import optax


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """Hyperparameters (defaults: XLM-R/RoBERTa pretraining, scaled for small runs)."""

  learning_rate: float = 5e-4
  warmup_steps: int = 100
  end_learning_rate_ratio: float = 0.0
  weight_decay: float = 0.01
  b1: float = 0.9
  b2: float = 0.98
  eps: float = 1e-6
  clip_norm: float = 1.0


def learning_rate_schedule(config: OptimizerConfig, total_steps: int) -> optax.Schedule:
  """0 -> peak over `warmup_steps`, then linear to `peak * end_learning_rate_ratio`."""
  warmup = max(0, min(config.warmup_steps, total_steps))
  peak = config.learning_rate
  decay = optax.linear_schedule(peak, peak * config.end_learning_rate_ratio, max(1, total_steps - warmup))
  if warmup == 0:
    return decay
  return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), decay], [warmup])


_DECAYED_NAMES = ("kernel", "embedding")


def decay_mask(params: Any) -> Any:
  """True for parameters that get weight decay (dense kernels and embeddings)."""

  def decayed(path, _):
    last = path[-1]
    name = getattr(last, "key", getattr(last, "name", str(last)))
    return str(name) in _DECAYED_NAMES

  return jax.tree_util.tree_map_with_path(decayed, params)


def make_optimizer(config: OptimizerConfig, total_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
  schedule = learning_rate_schedule(config, total_steps)
  tx = optax.chain(
      optax.clip_by_global_norm(config.clip_norm),
      optax.adamw(
          schedule, b1=config.b1, b2=config.b2, eps=config.eps,
          weight_decay=config.weight_decay, mask=decay_mask,
      ),
  )
  return tx, schedule
