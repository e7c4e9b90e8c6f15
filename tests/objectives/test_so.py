"""awesome-align's self-training objective (SO) against a NumPy port of its guide-head loss, pair by pair."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_xalign.data.vocab.specials import PROJECT
from flax_xalign.errors import UserError
from flax_xalign.models.encoder import Encoder
from flax_xalign.objectives import dwa
from flax_xalign.objectives import so
from flax_xalign.objectives.model import PretrainingModel
from tests.objectives.test_dwa import LENGTH, _batch

PAIR_SPANS = (((1, 3), (5, 8)), ((10, 12), (14, 16)))  # (source, target) subword spans of the row's two pairs.


def _softmax(x, axis):
  e = np.exp(x - x.max(axis=axis, keepdims=True))
  return e / e.sum(axis=axis, keepdims=True)


def _reference_pair_loss(x, y, guide):
  """One pair, as awesome-align's BertGuideHead computes it (float64): -(Σ P_src G / n_src + Σ P_tgt G / n_tgt)."""
  s = x @ y.T
  return -((_softmax(s, -1) * guide).sum() / len(x) + (_softmax(s, 0) * guide).sum() / len(y))


def test_so_loss_equals_the_reference_pair_by_pair():
  rng = np.random.default_rng(0)
  batch = _batch()
  hidden = rng.normal(size=(1, LENGTH, 6))
  link_mask, source, target = dwa.pair_masks(batch, PROJECT)
  labels = np.asarray(link_mask) & (rng.random((1, LENGTH, LENGTH)) < 0.4)
  scores = jnp.einsum("bid,bjd->bij", hidden, hidden).astype(jnp.float32)
  total, pairs = so.so_loss(scores, jnp.asarray(labels), link_mask, source, target, batch["segment_ids"])
  expected = [_reference_pair_loss(hidden[0, a0:a1], hidden[0, b0:b1], labels[0, a0:a1, b0:b1])
              for (a0, a1), (b0, b1) in PAIR_SPANS]
  assert float(pairs) == 2.0
  np.testing.assert_allclose(float(total), sum(expected), rtol=1e-5)


def test_self_labels_are_awesome_aligns_softmax_extraction():
  rng = np.random.default_rng(1)
  batch = _batch()
  hidden = rng.normal(size=(1, LENGTH, 6)) * 3
  link_mask, _, _ = dwa.pair_masks(batch, PROJECT)
  scores = jnp.einsum("bid,bjd->bij", hidden, hidden).astype(jnp.float32)
  got = np.asarray(so.self_labels(scores, link_mask, 0.2))
  expected = np.zeros_like(got)
  for (a0, a1), (b0, b1) in PAIR_SPANS:
    s = hidden[0, a0:a1] @ hidden[0, b0:b1].T
    expected[0, a0:a1, b0:b1] = (_softmax(s, -1) > 0.2) & (_softmax(s, 0) > 0.2)
  np.testing.assert_array_equal(got, expected)
  assert got.any() and not got.all()


@pytest.mark.parametrize("source", ["self", "links", "union"])
def test_so_term_trains_the_layers_below_the_alignment_layer(tiny_encoder, source):
  encoder = tiny_encoder.replace(vocab_size=31, dropout_rate=0.0)
  objective = so.SelfTraining(so.SoConfig(layer=1, label_source=source))
  assert objective.batch_features == (() if source == "self" else ("link_groups",))
  model = PretrainingModel(encoder=Encoder(encoder), objectives={"so": 1.0},
                           objective_options={"so": objective.config})
  batch = _batch(rows=2)
  batch["link_groups"] = jnp.asarray([[0, 1, 2, 0, 0, 1, 2, 2, 0, 0, 1, 0, 0, 0, 1, 2, 0, 0]] * 2, jnp.int32)
  params = jax.jit(lambda key: jax.tree.map(lambda x: x.unbox() if hasattr(x, "unbox") else x,
                                            model.init(key, batch=1, length=LENGTH),
                                            is_leaf=lambda x: hasattr(x, "unbox")))(jax.random.key(0))
  loss, metrics = jax.jit(lambda p: model.loss_fn(p, batch, jax.random.key(3)))(params)
  assert np.isfinite(float(loss)) and float(metrics["so_pairs"]) == 4.0
  if source == "links":
    assert float(metrics["so_labels"]) == float(metrics["so_given"]) == 8.0  # 4 links per row, 2 rows.
  grads = jax.jit(jax.grad(lambda p: model.loss_fn(p, batch, jax.random.key(3))[0]))(params)
  # Layers are stacked on a leading axis: the one layer below the alignment layer learns, the ones above do not.
  mlp = np.asarray(grads["layers"]["mlp"]["wi"]["kernel"])
  assert encoder.num_layers >= 2 and np.abs(mlp[0]).sum() > 0 and np.abs(mlp[1:]).sum() == 0
  assert float(jnp.abs(grads["token_embed"]["embedding"]).sum()) > 0


def test_so_config_is_validated():
  with pytest.raises(UserError, match="label_source='gold'"):
    so.SoConfig(label_source="gold")
  with pytest.raises(UserError, match="softmax_threshold=1.5"):
    so.SoConfig(softmax_threshold=1.5)
  assert so.default_layer(12) == 8 and so.default_layer(4) == 3
