"""Masked language modelling (MLM) and translation language modelling (TLM).

Both read the same masked forward pass: MLM scores the masked slots that fall
on monolingual tokens (`pair_side == 0`), TLM the slots inside a concatenated
translation pair (`pair_side > 0`), where the model may look across to the other
language. Logging them as two terms shows how much each data stream learns.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import optax

from flax_xalign.objectives.base import LossTerm, ObjectiveBase, StepContext, register, require_bitext

if TYPE_CHECKING:
  from flax_xalign.run_spec import RunSpec


def masked_cross_entropy(
    logits: jax.Array, targets: jax.Array, weights: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Summed token cross-entropy.

  Args:
    logits: [batch, predictions, vocab] (any float dtype; computed in f32).
    targets: [batch, predictions] int32.
    weights: [batch, predictions] float32, 0 for slots to ignore.

  Returns:
    (loss_sum, weight_sum, correct_sum) scalars; the normaliser is weight_sum.
  """
  logits = logits.astype(jnp.float32)
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
  correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
  return jnp.sum(losses * weights), jnp.sum(weights), jnp.sum(correct * weights)


@dataclasses.dataclass(frozen=True)
class MaskedLMObjective(ObjectiveBase):
  """Cross-entropy at the masked slots of one data stream.

  Attributes:
    bitext: False scores monolingual slots (MLM), True scores pair slots (TLM).
  """

  bitext: bool = False
  needs_all_hidden: bool = False

  def check(self, run: "RunSpec") -> None:
    if self.bitext:
      require_bitext("tlm", run, what="predicts masked tokens inside translation pairs")

  def __call__(self, ctx: StepContext) -> LossTerm:
    side = ctx.at_predictions("pair_side")
    in_stream = (side > 0) if self.bitext else (side == 0)
    weights = ctx.masked.weights * in_stream.astype(jnp.float32)
    loss_sum, count, correct = masked_cross_entropy(ctx.logits, ctx.masked.targets, weights)
    denom = jnp.maximum(count, 1.0)
    return LossTerm(
        loss=loss_sum / denom,
        metrics={"accuracy": correct / denom, "predictions": count},
        loss_sum=loss_sum,
        count=count,
    )


@register("mlm")
def mlm() -> MaskedLMObjective:
  return MaskedLMObjective(bitext=False)


@register("tlm")
def tlm() -> MaskedLMObjective:
  return MaskedLMObjective(bitext=True)
