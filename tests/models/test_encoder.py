"""Encoder outputs: shapes, axis names, masking, embeddings, MLM head."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.models.encoder_testlib import abstract_variables
from tests.models.encoder_testlib import BATCH
from tests.models.encoder_testlib import encode
from tests.models.encoder_testlib import LENGTH
from tests.models.encoder_testlib import encode_embeddings_with_grad
from tests.models.encoder_testlib import mlm_logits
from tests.models.encoder_testlib import variables_for
from flax_xalign.models import axes
from flax_xalign.models.encoder import attention_mask
from flax_xalign.models.encoder import Encoder


def test_output_shapes_and_all_hidden(config, batch):
  out = encode(variables_for(config), batch, config=config)
  assert out.hidden.shape == (BATCH, LENGTH, 24)
  assert out.hidden.dtype == jnp.float32
  assert len(out.all_hidden) == config.num_layers + 1
  for h in out.all_hidden:
    assert h.shape == (BATCH, LENGTH, 24)
  np.testing.assert_array_equal(out.all_hidden[-1], out.hidden)
  assert not np.allclose(out.all_hidden[0], out.hidden)


def test_all_hidden_is_optional(config, batch):
  # Shapes only: the numerics are those of the test above.
  out = jax.eval_shape(
      lambda v: encode(v, batch, config=config, return_all_hidden=False),
      variables_for(config))
  assert out.all_hidden is None
  assert out.hidden.shape == (BATCH, LENGTH, 24)


@pytest.mark.parametrize("overrides", [
    dict(num_languages=2), dict(num_languages=2, scan_layers=False),
    dict(pre_layer_norm=True)])
def test_every_param_has_logical_axes(config, overrides):
  variables = abstract_variables(config.replace(**overrides))
  specs = nn.get_partition_spec(variables)
  flat_specs = jax.tree_util.tree_leaves_with_path(
      specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
  flat_shapes = jax.tree.leaves(nn.unbox(variables))
  assert len(flat_specs) == len(flat_shapes)
  for (path, spec), leaf in zip(flat_specs, flat_shapes):
    assert len(spec) == len(leaf.shape), path
    assert all(name in axes.ALL_AXES for name in spec), (path, spec)
    assert len(set(spec)) == len(spec), (path, spec)
  token_spec = specs["params"]["token_embed"]["embedding"]
  assert token_spec == jax.sharding.PartitionSpec(axes.VOCAB, axes.EMBED)
  if overrides.get("scan_layers", True):
    assert specs["params"]["layers"]["mlp"]["wi"]["kernel"] == (
        jax.sharding.PartitionSpec(axes.LAYERS, axes.EMBED, axes.MLP))


def test_plain_init_creates_mlm_head(config, batch):
  variables = jax.eval_shape(lambda: Encoder(config).init(
      jax.random.key(0), batch["tokens"], lang_ids=None,
      positions=batch["positions"], segment_ids=batch["segment_ids"],
      deterministic=True))
  assert set(variables["params"]) == {
      "token_embed", "position_embed", "embed_norm", "layers", "mlm_head"}
  assert set(variables["params"]["mlm_head"]) == {
      "transform", "norm", "output_bias"}


def test_attention_mask():
  mask = attention_mask(jnp.array([[1, 1, 2, 0]]))
  expected = np.array([[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]])
  np.testing.assert_array_equal(mask[0, 0], expected.astype(bool))


def test_segments_are_isolated(config, batch):
  variables = variables_for(config)
  changed = dict(batch)
  tokens = np.array(batch["tokens"])
  tokens[0, 6:11] = (tokens[0, 6:11] + 7) % 61
  changed["tokens"] = tokens
  before = encode(variables, batch, config=config).hidden
  after = encode(variables, changed, config=config).hidden
  np.testing.assert_allclose(after[0, :6], before[0, :6], atol=1e-6)
  np.testing.assert_allclose(after[1:], before[1:], atol=1e-6)
  assert not np.allclose(after[0, 6:11], before[0, 6:11])


def test_padding_rows_are_finite(config, batch):
  out = encode(variables_for(config), batch, config=config)
  for h in out.all_hidden:
    assert np.all(np.isfinite(h))


def test_positions_matter(config, batch):
  variables = variables_for(config)
  permuted = dict(batch)
  positions = np.array(batch["positions"])
  positions[1] = positions[1, ::-1]
  permuted["positions"] = positions
  before = encode(variables, batch, config=config).hidden
  after = encode(variables, permuted, config=config).hidden
  assert not np.allclose(after[1], before[1])
  np.testing.assert_allclose(after[0], before[0], atol=1e-6)


def test_language_embeddings(config, batch):
  plain = variables_for(config)
  assert "language_embed" not in plain["params"]
  # Without language embeddings lang_ids is ignored.
  other_langs = {**batch, "lang_ids": np.ones((BATCH, LENGTH), np.int32)}
  np.testing.assert_array_equal(
      encode(plain, batch, config=config).hidden,
      encode(plain, other_langs, config=config).hidden)

  config = config.replace(num_languages=2)
  variables = variables_for(config)
  lang_ids = np.array(batch["lang_ids"])
  swapped = {**batch, "lang_ids": np.where(lang_ids == 1, 2, lang_ids)}
  before = encode(variables, batch, config=config).hidden
  after = encode(variables, swapped, config=config).hidden
  assert not np.allclose(after[1], before[1])
  with pytest.raises(ValueError, match="lang_ids"):
    Encoder(config).apply(
        variables, batch["tokens"], lang_ids=None,
        positions=batch["positions"], segment_ids=batch["segment_ids"],
        deterministic=True)


def test_pre_layer_norm(config, batch):
  post = encode(variables_for(config), batch, config=config)
  config = config.replace(pre_layer_norm=True)
  names = set(variables_for(config)["params"])
  assert "final_norm" in names and "embed_norm" not in names
  out = encode(variables_for(config), batch, config=config)
  assert np.all(np.isfinite(out.hidden))
  np.testing.assert_array_equal(out.all_hidden[-1], out.hidden)
  assert not np.allclose(out.hidden, post.hidden)


def test_input_embeddings_replace_lookup_and_grads_are_finite(config, batch):
  variables = variables_for(config)
  table = variables["params"]["token_embed"]["embedding"]
  expected = encode(variables, batch, config=config).hidden
  got, grad = encode_embeddings_with_grad(
      variables, batch, table[np.asarray(batch["tokens"])], config=config)
  np.testing.assert_allclose(got, expected, atol=1e-6)
  # Row 2 is all padding: its gradient must be finite too.
  assert np.all(np.isfinite(grad))
  assert np.any(grad[0] != 0)


def test_mlm_logits_shape_and_tying(config):
  variables = variables_for(config)
  table = variables["params"]["token_embed"]["embedding"]
  hidden = np.random.default_rng(1).normal(size=(BATCH, 4, 24)).astype(
      np.float32)
  logits = mlm_logits(variables, hidden, config=config)
  assert logits.shape == (BATCH, 4, 61)
  assert logits.dtype == jnp.float32

  params = jax.tree.map(lambda x: x, variables["params"])
  params["token_embed"] = {"embedding": 2.0 * table}
  changed = mlm_logits({"params": params}, hidden, config=config)
  # Logits are t(h) . E^T + b, so scaling E scales the logits less the bias.
  bias = params["mlm_head"]["output_bias"]
  np.testing.assert_allclose(changed - bias, 2.0 * (logits - bias), rtol=1e-5,
                             atol=1e-5)
  assert not np.allclose(changed, logits)
