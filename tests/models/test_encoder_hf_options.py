"""The two options that let the encoder hold BERT / XLM-R weights: token types and a position offset."""

import flax.linen as nn
import jax
import numpy as np
import pytest

from flax_xalign.models import axes, flops
from flax_xalign.models.config import EncoderConfig
from tests.models.encoder_testlib import BATCH, LENGTH, abstract_variables, encode, variables_for
from tests.testlib import TINY_ENCODER

_SIZES = {k: TINY_ENCODER[k] for k in ("num_layers", "embed_dim", "num_heads", "head_dim", "mlp_dim")}


@pytest.mark.parametrize("field,value", [
    ("num_token_types", -1), ("num_token_types", 1.5), ("num_token_types", True),
    ("position_offset", -2), ("position_offset", 514), ("position_offset", True),
])
def test_invalid_values_name_the_field(field, value):
  with pytest.raises(ValueError, match=field):
    EncoderConfig(**{**_SIZES, field: value})


def test_defaults_keep_the_tree(config):
  assert (config.num_token_types, config.position_offset) == (0, 0)
  assert config.num_positions == config.max_positions == 17
  assert "type_embed" not in abstract_variables(config)["params"]
  assert config.replace(position_offset=2).num_positions == 15


def _with_types(config, variables, rows):
  """`variables` plus a wide random type table, checked against the real init's shapes."""
  table = np.random.default_rng(3).normal(0.0, 0.5, (rows, config.embed_dim)).astype(np.float32)
  params = {**variables["params"], "type_embed": {"embedding": table}}
  typed = config.replace(num_token_types=rows)
  expected = nn.unbox(abstract_variables(typed))["params"]
  assert jax.tree.structure(params) == jax.tree.structure(expected)
  assert expected["type_embed"]["embedding"].shape == (rows, config.embed_dim)
  return typed, {"params": params}


def test_type_row_zero_is_added_to_every_token(config, batch):
  typed, variables = _with_types(config, variables_for(config), rows=3)
  spec = nn.get_partition_spec(abstract_variables(typed))["params"]["type_embed"]["embedding"]
  assert spec == jax.sharding.PartitionSpec(axes.LANGUAGES, axes.EMBED)
  got = encode(variables, batch, config=typed).all_hidden
  # The same as feeding token embedding + row 0 to the plain model.
  table = variables["params"]["token_embed"]["embedding"]
  embeddings = table[np.asarray(batch["tokens"])] + variables["params"]["type_embed"]["embedding"][0]
  want = encode(variables_for(config), batch, config=config, input_embeddings=embeddings).all_hidden
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, atol=1e-5)
  assert not np.allclose(got[-1], encode(variables_for(config), batch, config=config).hidden, atol=1e-3)
  # Rows >= 1 (segment B) are carried but never read.
  other = {"params": {**variables["params"], "type_embed": {"embedding": np.concatenate(
      [variables["params"]["type_embed"]["embedding"][:1], np.zeros((2, typed.embed_dim), np.float32)])}}}
  np.testing.assert_array_equal(encode(other, batch, config=typed).hidden, got[-1])


def test_position_offset_reads_later_rows(config, batch):
  shifted = config.replace(position_offset=2)
  variables = variables_for(config)
  table = variables["params"]["position_embed"]["embedding"]
  # Offset 2 over table T is offset 0 over T[2:] (two rows shorter).
  plain = config.replace(max_positions=config.max_positions - 2)
  plain_variables = {"params": {**variables["params"], "position_embed": {"embedding": table[2:]}}}
  np.testing.assert_allclose(encode(variables, batch, config=shifted).hidden,
                             encode(plain_variables, batch, config=plain).hidden, atol=1e-6)
  assert not np.allclose(encode(variables, batch, config=shifted).hidden[1],
                         encode(variables, batch, config=config).hidden[1], atol=1e-3)
  # A position past num_positions gathers NaN instead of a clipped row.
  beyond = {**batch, "positions": np.full((BATCH, LENGTH), shifted.num_positions, np.int32)}
  assert np.isnan(encode(variables, beyond, config=shifted).hidden[1]).all()


def test_counts_include_the_type_table(config):
  typed = config.replace(num_token_types=2)
  assert (flops.count_params(abstract_variables(typed)) - flops.count_params(abstract_variables(config))
          == 2 * config.embed_dim)
  # A gather, not a matmul: no FLOPs.
  kwargs = dict(batch=3, length=13, num_predictions=4)
  assert flops.train_flops_per_step(typed, **kwargs) == flops.train_flops_per_step(config, **kwargs)
