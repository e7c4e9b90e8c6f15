"""On-device BERT-style masking with a static number of prediction slots.

Every row gets `floor(mask_rate * n + u)` masked positions (u ~ U[0, 1), the
rounding fairseq uses), where n counts the row's eligible tokens (never padding
or special tokens). Positions are chosen uniformly without replacement by taking
the top-k of random scores, so the output has a static shape `[batch,
max_predictions]` that the MLM head can be evaluated on: computing logits only at
masked positions is what makes the vocabulary projection affordable.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp


class MaskedTokens(NamedTuple):
  """Result of `mask_tokens`.

  Attributes:
    inputs: [batch, length] int32 corrupted tokens fed to the encoder.
    positions: [batch, predictions] int32 positions of the prediction slots.
      Slots with weight 0 point at an arbitrary position and are ignored.
    targets: [batch, predictions] int32 original tokens at `positions`.
    weights: [batch, predictions] float32, 1.0 for a real prediction.
  """

  inputs: jax.Array
  positions: jax.Array
  targets: jax.Array
  weights: jax.Array


def max_predictions_for(length: int, mask_rate: float) -> int:
  """The number of prediction slots that always covers `mask_rate` of a row."""
  if not 0.0 < mask_rate < 1.0:
    raise ValueError(f"mask_rate must be in (0, 1), got {mask_rate}")
  return max(1, math.ceil(mask_rate * length))


def mask_tokens(
    tokens: jax.Array,
    rng: jax.Array,
    *,
    eligible: jax.Array,
    vocab_size: int,
    mask_id: int,
    first_random_id: int,
    mask_rate: float = 0.15,
    replace_with_mask_rate: float = 0.8,
    replace_with_random_rate: float = 0.1,
    max_predictions: int | None = None,
) -> MaskedTokens:
  """Chooses positions to predict and corrupts them (80/10/10 by default).

  Args:
    tokens: [batch, length] int32 token ids.
    rng: PRNG key for this step.
    eligible: [batch, length] bool, True where a token may be masked (not
      padding, not a special token).
    vocab_size: random replacements are drawn from [first_random_id, vocab_size).
    mask_id: id of the `<mask>` token.
    first_random_id: smallest id a random replacement may take (skips specials).
    mask_rate: fraction of eligible tokens to predict.
    replace_with_mask_rate: of the chosen tokens, the fraction shown as <mask>.
    replace_with_random_rate: the fraction shown as a random token; the rest
      stay unchanged.
    max_predictions: number of prediction slots; defaults to
      `ceil(mask_rate * length)`, which no row can exceed.

  Returns:
    A `MaskedTokens`.
  """
  batch, length = tokens.shape
  if max_predictions is None:
    max_predictions = max_predictions_for(length, mask_rate)
  max_predictions = min(max_predictions, length)
  if replace_with_mask_rate + replace_with_random_rate > 1.0:
    raise ValueError("replace_with_mask_rate + replace_with_random_rate must be <= 1")
  rng_count, rng_choose, rng_action, rng_random = jax.random.split(rng, 4)

  num_eligible = jnp.sum(eligible, axis=-1).astype(jnp.float32)
  num_to_mask = jnp.floor(
      mask_rate * num_eligible + jax.random.uniform(rng_count, (batch,))
  ).astype(jnp.int32)
  num_to_mask = jnp.minimum(num_to_mask, max_predictions)

  # Uniform scores for eligible tokens and -1 elsewhere: the top-k of a row are
  # a uniformly random subset of its eligible positions.
  scores = jnp.where(eligible, jax.random.uniform(rng_choose, (batch, length)), -1.0)
  top_scores, positions = jax.lax.top_k(scores, max_predictions)
  slot = jnp.arange(max_predictions, dtype=jnp.int32)[None, :]
  chosen = (slot < num_to_mask[:, None]) & (top_scores >= 0.0)

  targets = jnp.take_along_axis(tokens, positions, axis=1)
  action = jax.random.uniform(rng_action, (batch, max_predictions))
  random_tokens = jax.random.randint(
      rng_random, (batch, max_predictions), first_random_id, vocab_size, dtype=tokens.dtype
  )
  shown = jnp.where(
      action < replace_with_mask_rate,
      jnp.asarray(mask_id, tokens.dtype),
      jnp.where(action < replace_with_mask_rate + replace_with_random_rate, random_tokens, targets),
  )
  shown = jnp.where(chosen, shown, targets)
  rows = jnp.arange(batch)[:, None]
  # top_k positions are distinct within a row, so the scatter has no collisions.
  inputs = tokens.at[rows, positions].set(shown)
  return MaskedTokens(
      inputs=inputs,
      positions=positions.astype(jnp.int32),
      targets=targets,
      weights=chosen.astype(jnp.float32),
  )
