"""Masking invariants: counts, eligibility, 80/10/10, static shapes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_xalign.objectives.masking import mask_tokens, max_predictions_for

VOCAB, MASK_ID, FIRST = 61, 4, 5


def _tokens(batch=7, length=13, seed=0, pad_from=None):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(FIRST, VOCAB, size=(batch, length)).astype(np.int32)
  tokens[:, 0] = 3  # <s>
  tokens[:, -1] = 1  # </s>
  if pad_from is not None:
    for row, start in enumerate(pad_from):
      tokens[row, start:] = 0
  return jnp.asarray(tokens)


@jax.jit
def _mask_jit(tokens, key):
  return mask_tokens(tokens, key, eligible=tokens >= FIRST, vocab_size=VOCAB,
                     mask_id=MASK_ID, first_random_id=FIRST)


def _mask(tokens, seed=0):
  return _mask_jit(tokens, jax.random.key(seed))


def test_shapes_and_static_slot_count():
  tokens = _tokens()
  out = _mask(tokens)
  p = max_predictions_for(13, 0.15)
  assert p == 2
  assert out.inputs.shape == tokens.shape
  assert out.positions.shape == out.targets.shape == out.weights.shape == (7, p)


def test_only_eligible_positions_are_chosen_and_changed():
  tokens = _tokens(batch=11, pad_from=[13, 12, 9, 5, 2, 1, 13, 13, 7, 3, 13])
  for seed in range(20):
    out = _mask(tokens, seed=seed)
    chosen = np.zeros(tokens.shape, bool)
    w, pos = np.asarray(out.weights), np.asarray(out.positions)
    for r in range(tokens.shape[0]):
      chosen[r, pos[r][w[r] > 0]] = True
    assert not np.any(chosen & (np.asarray(tokens) < FIRST)), "special or pad token masked"
    changed = np.asarray(out.inputs) != np.asarray(tokens)
    assert not np.any(changed & ~chosen), "a position changed without being a prediction"
    np.testing.assert_array_equal(np.take_along_axis(np.asarray(tokens), pos, 1), out.targets)


def test_rate_and_split_statistics():
  tokens = _tokens(batch=512, length=101, seed=3)
  out = _mask(tokens, seed=1)
  eligible = 99 * 512
  w = np.asarray(out.weights)
  assert abs(w.sum() / eligible - 0.15) < 0.005
  shown = np.take_along_axis(np.asarray(out.inputs), np.asarray(out.positions), 1)[w > 0]
  target = np.asarray(out.targets)[w > 0]
  frac_mask = np.mean(shown == MASK_ID)
  frac_same = np.mean(shown == target)
  assert abs(frac_mask - 0.8) < 0.02
  # 10% unchanged plus random draws that hit the target by chance (1/56).
  assert abs(frac_same - (0.1 + 0.1 / (VOCAB - FIRST))) < 0.02
  assert np.all(shown[(shown != MASK_ID)] >= FIRST)


def test_per_row_count_follows_fairseq_rounding():
  tokens = _tokens(batch=64, length=41, seed=5)
  out = _mask(tokens, seed=2)
  counts = np.asarray(out.weights).sum(1)
  n = 39
  assert set(np.unique(counts)) <= {np.floor(0.15 * n), np.floor(0.15 * n) + 1}


def test_empty_and_length_one_rows():
  tokens = jnp.zeros((3, 1), jnp.int32).at[1, 0].set(9)
  out = _mask(tokens)
  assert out.positions.shape == (3, 1)
  assert float(out.weights[0].sum()) == 0.0 and float(out.weights[2].sum()) == 0.0


def test_deterministic_given_key():
  tokens = _tokens()
  a, b = _mask(tokens, seed=4), _mask(tokens, seed=4)
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x, y)
  c = _mask(tokens, seed=5)
  assert not np.array_equal(a.positions, c.positions)


def test_rejects_bad_rates():
  with pytest.raises(ValueError):
    max_predictions_for(10, 0.0)
