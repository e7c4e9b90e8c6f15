"""Shared tiny encoder config and batch (odd, distinct sizes; STYLE.md)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.models.encoder_testlib import BASE_CONFIG
from tests.models.encoder_testlib import BATCH
from tests.models.encoder_testlib import LENGTH
from flax_xalign.models.config import EncoderConfig


@pytest.fixture
def config() -> EncoderConfig:
  return BASE_CONFIG


@pytest.fixture
def batch() -> dict[str, jax.Array]:
  """Row 0 packs two segments and padding; row 1 is one full segment; row 2 is
  entirely padding."""
  rng = np.random.default_rng(0)
  segment_ids = np.array([
      [1] * 6 + [2] * 5 + [0] * 2,
      [1] * LENGTH,
      [0] * LENGTH,
  ], np.int32)
  positions = np.zeros_like(segment_ids)
  for row in range(BATCH):
    for seg in (1, 2):
      idx = np.flatnonzero(segment_ids[row] == seg)
      positions[row, idx] = np.arange(len(idx))
  tokens = rng.integers(5, 61, size=(BATCH, LENGTH)).astype(np.int32)
  tokens[segment_ids == 0] = 0
  lang_ids = np.where(segment_ids == 2, 2, 1).astype(np.int32)
  lang_ids[segment_ids == 0] = 0
  return dict(tokens=jnp.asarray(tokens), lang_ids=jnp.asarray(lang_ids),
              positions=jnp.asarray(positions),
              segment_ids=jnp.asarray(segment_ids))
