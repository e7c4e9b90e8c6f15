"""On-device BERT-style masking with a static number of prediction slots.

Every row gets `floor(mask_rate * n + u)` masked positions (u ~ U[0, 1), the
rounding fairseq uses), where n counts the row's eligible tokens (never padding
or special tokens). Positions are chosen uniformly without replacement by taking
the top-k of random scores, so the output has a static shape `[batch,
max_predictions]` that the MLM head can be evaluated on: computing logits only at
masked positions is what makes the vocabulary projection affordable.

Random replacements come from the regular ids of the masked token's own
vocabulary copy (`copy_ranges`): with the synthetic languages' doubled
vocabulary (2V ids over V pieces, derived id = natural id + V) a natural token
is replaced by a natural one and a derived token by a derived one, and the
copies of the special ids (V..V + first_regular - 1, never in any text) are
never drawn.
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


def copy_ranges(copy: jax.Array, *, vocab_size: int, copies: int, first_regular: int,
                end_regular: int | None) -> tuple[jax.Array, jax.Array]:
  """[low, high) of the regular ids of vocabulary copy `copy`.

  Args:
    copy: int array (any shape), which copy of the vocabulary: 0 for the
      natural ids [0, V), 1 for the derived ids [V, 2V), ... (V = vocab_size
      // copies); values outside 0..copies-1 are clipped.
    vocab_size: the model's embedding rows (copies * V).
    copies: 1, or 2 for a doubled vocabulary.
    first_regular, end_regular: the regular ids of one copy
      (`SpecialTokens`; end None = V).

  Returns:
    (low, high) int32 arrays shaped like `copy`.
  """
  if copies < 1 or vocab_size % copies:
    raise ValueError(f"vocab_size={vocab_size} is not {copies} copies of one vocabulary")
  pieces = vocab_size // copies
  end = pieces if end_regular is None else min(end_regular, pieces)
  base = jnp.clip(copy, 0, copies - 1).astype(jnp.int32) * pieces
  return base + first_regular, base + end


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
    random_low: jax.Array | None = None,
    random_high: jax.Array | None = None,
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
    random_low, random_high: optional [batch, length] int per-position range
      [low, high) of random replacements (`copy_ranges`); they override
      `first_random_id` and `vocab_size`.

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
  low, high = first_random_id, vocab_size
  if random_low is not None:
    low = jnp.take_along_axis(random_low, positions, axis=1)
  if random_high is not None:
    high = jnp.take_along_axis(random_high, positions, axis=1)
  random_tokens = jax.random.randint(rng_random, (batch, max_predictions), low, high, dtype=tokens.dtype)
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
