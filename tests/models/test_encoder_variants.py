"""Encoder variants: scanned vs unrolled layers, remat, bf16, dropout."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.models.encoder_testlib import abstract_variables
from tests.models.encoder_testlib import encode
from tests.models.encoder_testlib import encode_embeddings_with_grad
from tests.models.encoder_testlib import mlm_logits
from tests.models.encoder_testlib import variables_for
from flax_xalign.models.encoder import Encoder
from flax_xalign.models.encoder import stack_layers
from flax_xalign.models.encoder import unstack_layers
from flax_xalign.models.flops import count_params


def test_scan_and_unrolled_layers_agree(config, batch):
  unrolled = config.replace(scan_layers=False)
  assert count_params(abstract_variables(config)) == count_params(
      abstract_variables(unrolled))
  # variables_for converts the scanned params with unstack_layers.
  scanned_out = encode(variables_for(config), batch, config=config)
  unrolled_out = encode(variables_for(unrolled), batch, config=unrolled)
  np.testing.assert_allclose(unrolled_out.hidden, scanned_out.hidden,
                             atol=1e-5)
  for a, b in zip(unrolled_out.all_hidden, scanned_out.all_hidden,
                  strict=True):
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_stack_layers_inverts_unstack(config):
  params = variables_for(config)["params"]
  roundtrip = stack_layers(unstack_layers(params, 2), 2)
  assert jax.tree.structure(roundtrip) == jax.tree.structure(params)
  for a, b in zip(jax.tree.leaves(roundtrip), jax.tree.leaves(params)):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("policy,scan_layers", [("full", True),
                                                ("dots", False)])
def test_remat_traces_checkpointed_layers(config, batch, policy, scan_layers):
  # Tracing only (no compile, to keep the suite fast): the layer is wrapped in
  # a checkpoint and the gradient has the right structure. The math is the
  # plain layer's, which the other tests check numerically.
  config = config.replace(remat_policy=policy, scan_layers=scan_layers)
  variables = nn.unbox(abstract_variables(config))

  def loss(v):
    hidden = Encoder(config).apply(
        v, batch["tokens"], lang_ids=None, positions=batch["positions"],
        segment_ids=batch["segment_ids"], deterministic=False,
        return_all_hidden=True, rngs={"dropout": jax.random.key(0)}).hidden
    return jnp.sum(hidden**2)

  closed = jax.make_jaxpr(jax.grad(loss))(variables)
  assert "checkpoint" in str(closed) or "remat" in str(closed)
  leaves = jax.tree.leaves(variables)
  assert [a.shape for a in closed.out_avals] == [a.shape for a in leaves]


def test_bfloat16_compute_keeps_float32_params(config, batch):
  config = config.replace(dtype="bfloat16")
  for leaf in jax.tree.leaves(nn.unbox(abstract_variables(config))):
    assert leaf.dtype == jnp.float32
  variables = variables_for(config)
  out = encode(variables, batch, config=config)
  assert out.hidden.dtype == jnp.bfloat16
  assert np.all(np.isfinite(np.asarray(out.hidden, np.float32)))
  logits = mlm_logits(variables, out.hidden[:, :4], config=config)
  assert logits.dtype == jnp.float32
  assert np.all(np.isfinite(logits))
  reference = encode(variables, batch, config=config.replace(dtype="float32"))
  np.testing.assert_allclose(np.asarray(out.hidden, np.float32),
                             reference.hidden, atol=0.1)


def test_dropout(config, batch):
  variables = variables_for(config)
  # "rbg" keys: dropout masks from XLA's RngBitGenerator compile several times
  # faster on CPU than threefry; the model code is agnostic to the key type.
  def run(seed):
    return encode(variables, batch, config=config, deterministic=False,
                  dropout_rng=jax.random.key(seed, impl="rbg")).hidden

  first, again, other = run(1), run(1), run(2)
  clean = encode(variables, batch, config=config).hidden
  np.testing.assert_array_equal(first, again)
  assert not np.allclose(first, other)
  assert not np.allclose(first, clean)
  np.testing.assert_array_equal(
      clean, encode(variables, batch, config=config).hidden)


@pytest.mark.parametrize("implementation", ["xla", "cudnn"])
def test_fused_attention_computes_the_einsum_attention(config, batch, implementation):
  # The reference is the explicit einsum path; packing (two segments in row 0),
  # padding and an all-padding row go through the same boolean mask.
  # Off a GPU, "cudnn" is the path of a reader (eval, align) opening a run
  # trained with it: the layer falls back to XLA's attention.
  dtype = "bfloat16" if implementation == "cudnn" else "float32"
  einsum = config.replace(attention_dropout_rate=0.0, dtype=dtype)
  fused = einsum.replace(attention_implementation=implementation)
  variables = variables_for(config)
  x = jax.random.normal(jax.random.key(3), batch["tokens"].shape + (config.embed_dim,))
  want, want_grad = encode_embeddings_with_grad(variables, batch, x, config=einsum)
  got, got_grad = encode_embeddings_with_grad(variables, batch, x, config=fused)
  real = np.asarray(batch["segment_ids"]) > 0
  tol = 2e-2 if dtype == "bfloat16" else 2e-5
  np.testing.assert_allclose(np.asarray(got, np.float32)[real], np.asarray(want, np.float32)[real],
                             atol=tol, rtol=tol)
  np.testing.assert_allclose(np.asarray(got_grad, np.float32)[real],
                             np.asarray(want_grad, np.float32)[real], atol=tol * 10, rtol=tol)
