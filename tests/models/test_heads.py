"""Task heads: shapes, parameters, what they read, dropout."""

import jax
import numpy as np
import pytest

from tests.models.encoder_testlib import BASE_CONFIG
from flax_xalign.errors import UserError
from flax_xalign.models import heads


def test_classification_head_reads_only_the_first_state():
  head = heads.make_head(BASE_CONFIG, "classification", 2)
  assert isinstance(head, heads.ClassificationHead) and head.dropout_rate == BASE_CONFIG.dropout_rate
  hidden = np.random.default_rng(0).normal(size=(3, 5, 24)).astype(np.float32)
  variables = head.init(jax.random.key(0), hidden, deterministic=True)
  assert set(variables["params"]) == {"dense", "out"}
  logits = head.apply(variables, hidden, deterministic=True)
  assert logits.shape == (3, 2)
  # Only the <s> state is read.
  changed = hidden.copy()
  changed[:, 1:] = 0.0
  np.testing.assert_allclose(head.apply(variables, changed, deterministic=True), logits)


def test_tagging_head_maps_every_token():
  head = heads.make_head(BASE_CONFIG, "tagging", 7)
  assert isinstance(head, heads.TaggingHead)
  hidden = np.random.default_rng(1).normal(size=(3, 5, 24)).astype(np.float32)
  variables = head.init(jax.random.key(0), hidden, deterministic=True)
  assert set(variables["params"]) == {"out"}
  assert variables["params"]["out"]["kernel"].shape == (24, 7)
  logits = head.apply(variables, hidden, deterministic=True)
  assert logits.shape == (3, 5, 7)
  # Per token: a token's logits do not depend on the others.
  changed = hidden.copy()
  changed[:, 1:] = 0.0
  np.testing.assert_allclose(head.apply(variables, changed, deterministic=True)[:, 0],
                             logits[:, 0], rtol=1e-6)
  # Dropout is on only when not deterministic.
  dropped = head.apply(variables, hidden, deterministic=False,
                       rngs={"dropout": jax.random.key(1)})
  assert not np.allclose(dropped, logits)


def test_make_head_rejects_unknown_tasks():
  with pytest.raises(UserError, match="unknown task 'ner'"):
    heads.make_head(BASE_CONFIG, "ner", 3)
