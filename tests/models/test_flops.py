"""FLOP and parameter counts against hand counts and the traced program."""

import math

import flax.linen as nn
import jax
from jax.extend import core as jax_core
import jax.numpy as jnp
import pytest

from tests.models.encoder_testlib import abstract_variables
from flax_xalign.models import config as config_lib
from flax_xalign.models import flops
from flax_xalign.models.encoder import Encoder

_B, _T, _P = 3, 13, 4


def test_matches_hand_count(config):
  # e = 24, a = heads * head_dim = 30, m = 40, V = 61, L = 2.
  weights = 2 * _B * _T * (4 * 24 * 30 + 2 * 24 * 40)
  attention = 4 * _B * _T**2 * 30
  head = 2 * _B * _P * (24 * 24 + 24 * 61)
  forward = 2 * (weights + attention) + head
  assert forward == 919440
  assert flops.forward_flops_per_step(
      config, batch=_B, length=_T, num_predictions=_P) == forward
  assert flops.train_flops_per_step(
      config, batch=_B, length=_T, num_predictions=_P) == 3 * forward


def test_linear_in_layers_and_batch(config):
  def count(**overrides):
    kwargs = dict(batch=_B, length=_T, num_predictions=_P)
    sizes = {k: overrides.pop(k) for k in list(overrides) if k in kwargs}
    return flops.train_flops_per_step(config.replace(**overrides),
                                      **{**kwargs, **sizes})

  per_layer = count(num_layers=2) - count(num_layers=1)
  assert per_layer > 0
  assert count(num_layers=5) - count(num_layers=2) == 3 * per_layer
  assert count(batch=2 * _B) == 2 * count()


def _dot_flops(jaxpr) -> int:
  """2 * output size * contracted size, summed over every dot_general."""
  total = 0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      (lhs_contract, _), _ = eqn.params["dimension_numbers"]
      lhs_shape = eqn.invars[0].aval.shape
      contracted = math.prod(lhs_shape[d] for d in lhs_contract)
      total += 2 * math.prod(eqn.outvars[0].aval.shape) * contracted
    for sub in jax_core.jaxprs_in_params(eqn.params):
      total += _dot_flops(sub)
  return total


def test_matches_traced_matmuls(config):
  config = config.replace(scan_layers=False)  # A flat program to count.
  variables = nn.unbox(abstract_variables(config))
  tokens = jnp.ones((_B, _T), jnp.int32)
  encoder = Encoder(config)

  def loss(v):
    hidden = encoder.apply(v, tokens, lang_ids=None, positions=tokens,
                           segment_ids=tokens, deterministic=True).hidden
    logits = encoder.apply(v, hidden[:, :_P], method=Encoder.mlm_logits)
    return jnp.sum(logits)

  forward = _dot_flops(jax.make_jaxpr(loss)(variables).jaxpr)
  train = _dot_flops(jax.make_jaxpr(jax.grad(loss))(variables).jaxpr)
  kwargs = dict(batch=_B, length=_T, num_predictions=_P)
  assert forward == flops.forward_flops_per_step(config, **kwargs)
  assert train == flops.train_flops_per_step(config, **kwargs)


def test_count_params(config):
  # q, k, v: [e, a] + [a]; out: [a, e] + [e]; e = 24, a = 30.
  per_layer = 3 * (24 * 30 + 30) + (30 * 24 + 24) + 24 * 40 + 40 + 40 * 24 + 24
  per_layer += 2 * 2 * 24  # Two LayerNorms.
  embeddings = 61 * 24 + 17 * 24 + 2 * 24
  head = 24 * 24 + 24 + 2 * 24 + 61
  expected = embeddings + 2 * per_layer + head
  assert flops.count_params(abstract_variables(config)) == expected == 12777


def test_base_preset_is_xlmr_base_sized():
  # HF XLMRobertaModel (xlm-roberta-base) has 278,043,648 parameters: ours
  # less its 1-row token-type table and its pooler, plus our MLM head.
  config = config_lib.base(vocab_size=250002)
  count = flops.count_params(abstract_variables(config))
  pooler = 768 * 768 + 768
  mlm_head = 768 * 768 + 768 + 2 * 768 + 250002
  assert count == 278_043_648 - 768 - pooler + mlm_head


def test_mfu_and_peaks():
  assert flops.mfu(50e12, 200e12) == pytest.approx(0.25)
  with pytest.raises(ValueError):
    flops.mfu(1.0, 0.0)
  assert flops.peak_flops_per_device("TPU v4") == 275e12
  assert flops.peak_flops_per_device("TPU v5 lite") == 197e12
  assert flops.peak_flops_per_device("cpu") is None


def test_vocab_size_required():
  with pytest.raises(ValueError, match="vocab_size"):
    flops.train_flops_per_step(config_lib.tiny(), batch=1, length=2,
                               num_predictions=1)
