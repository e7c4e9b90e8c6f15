"""Task heads for fine-tuning the encoder: token tagging and sentence classification.

RoBERTa's heads (Hugging Face `RobertaForTokenClassification` /
`RobertaClassificationHead`), read off the encoder's last hidden states. They
compute in float32 whatever the encoder's dtype, since their logits feed a
softmax cross-entropy.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from flax_xalign.errors import UserError
from flax_xalign.models.config import EncoderConfig

TASKS = ("tagging", "classification")


class TaggingHead(nn.Module):
  """RoBERTa's token-classification head: dropout, then a dense map per token."""

  num_tags: int
  dropout_rate: float = 0.1
  initializer_std: float = 0.02

  @nn.compact
  def __call__(self, hidden: jax.Array, *, deterministic: bool) -> jax.Array:
    """hidden [batch, length, embed] -> logits [batch, length, num_tags] float32."""
    x = nn.Dropout(self.dropout_rate)(hidden.astype(jnp.float32), deterministic=deterministic)
    return nn.Dense(self.num_tags, kernel_init=nn.initializers.normal(self.initializer_std),
                    name="out")(x)


class ClassificationHead(nn.Module):
  """RoBERTa's sentence head on the `<s>` state: dropout, dense + tanh, dropout, dense."""

  num_classes: int
  dropout_rate: float = 0.1
  initializer_std: float = 0.02

  @nn.compact
  def __call__(self, hidden: jax.Array, *, deterministic: bool) -> jax.Array:
    """hidden [batch, length, embed] -> logits [batch, num_classes] float32."""
    init = nn.initializers.normal(self.initializer_std)
    dropout = nn.Dropout(self.dropout_rate)
    x = dropout(hidden[:, 0].astype(jnp.float32), deterministic=deterministic)
    x = jnp.tanh(nn.Dense(hidden.shape[-1], kernel_init=init, name="dense")(x))
    x = dropout(x, deterministic=deterministic)
    return nn.Dense(self.num_classes, kernel_init=init, name="out")(x)


def make_head(config: EncoderConfig, task: str, num_labels: int) -> nn.Module:
  """The head of `task` ("tagging" or "classification"), with the encoder's dropout and init scale."""
  if task not in TASKS:
    raise UserError(f"unknown task {task!r}; use one of {', '.join(TASKS)}.")
  head = TaggingHead if task == "tagging" else ClassificationHead
  return head(num_labels, dropout_rate=config.dropout_rate,
              initializer_std=config.initializer_std)
