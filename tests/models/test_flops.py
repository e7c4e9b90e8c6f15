"""FLOP and parameter counts against hand counts and the traced program."""

import math
import types

import flax.linen as nn
import jax
from jax.extend import core as jax_core
import jax.numpy as jnp
import numpy as np
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


# The model-FLOP count on real tokens (MFU's). The tiny config: e = 24,
# a = 30, m = 40, V = 61, L = 2, so per token N = 2·(4·24·30 + 2·24·40) = 9600
# weights (6·N = 57,600 FLOPs), 12·L·a = 720 FLOPs per attended key, and a
# predicted slot goes through e² + e·V = 576 + 1464 = 2040 head weights
# (6·2040 = 12,240 FLOPs).


def test_model_flops_of_one_full_row_by_hand(config):
  # One row of 13 real tokens, one segment, every token eligible, rate 0.15:
  # n = 13, A = 13² = 169, p = 0.15·13 = 1.95.
  counts = flops.count_tokens(np.ones((1, 13), np.int32), mask_rate=0.15)
  assert counts == (13, 169, pytest.approx(1.95))
  expected = 57_600 * 13 + 720 * 169 + 12_240 * 1.95
  assert expected == pytest.approx(894_348)
  assert flops.model_train_flops(config, counts) == pytest.approx(expected)
  # Without padding or packing the standard count is the all-slot count of
  # the same row (checked against the traced matmuls below) at p = rate·T.
  assert flops.model_train_flops(config, counts) == pytest.approx(
      flops.train_flops_per_step(config, batch=1, length=13, num_predictions=1.95))


def test_model_flops_with_padding_and_packing_by_hand(config):
  segment_ids = np.array([[1, 1, 1, 2, 2, 0, 0],   # two segments (3 + 2) and 2 padding slots
                          [1, 1, 1, 1, 0, 0, 0],   # one segment of 4, 3 padding slots
                          [0, 0, 0, 0, 0, 0, 0],   # all padding
                          [2, 2, 1, 1, 1, 2, 0]],  # segment 2 split around segment 1: 3 + 3
                         np.int32)
  # The first token of each segment is special (not eligible).
  eligible = np.array([[0, 1, 1, 0, 1, 1, 1],
                       [0, 1, 1, 1, 1, 1, 1],
                       [1, 1, 1, 1, 1, 1, 1],
                       [0, 1, 0, 1, 1, 1, 1]], bool)
  counts = flops.count_tokens(segment_ids, mask_rate=0.15, eligible=eligible)
  tokens = 5 + 4 + 0 + 6
  attended = (3**2 + 2**2) + 4**2 + 0 + (3**2 + 3**2)
  predictions = 0.15 * (3 + 3 + 0 + 4)  # Padding is never eligible, whatever `eligible` says.
  assert counts == (tokens, attended, pytest.approx(predictions))
  assert (tokens, attended) == (15, 47)
  expected = 57_600 * 15 + 720 * 47 + 12_240 * 1.5
  assert flops.model_train_flops(config, counts) == pytest.approx(expected) == pytest.approx(916_200)
  # The all-slot count of the same [4, 7] batch (p = ceil(0.15·7) = 2 slots per
  # row) is what `mfu` was logged from before: 28 slots, 4·7² keys.
  all_slots = 57_600 * 28 + 720 * 4 * 49 + 12_240 * 4 * 2
  assert flops.train_flops_per_step(config, batch=4, length=7, num_predictions=2) == all_slots
  assert all_slots == 1_851_840  # 2.02x the model FLOPs of the batch.


def test_count_tokens_of_padding_only_and_bad_shape():
  assert flops.count_tokens(np.zeros((2, 5), np.int32), mask_rate=0.15) == (0, 0, 0)
  with pytest.raises(ValueError, match=r"\[batch, length\]"):
    flops.count_tokens(np.ones(5, np.int32), mask_rate=0.15)


def test_xlmr_base_flops_per_token_by_hand():
  # XLM-R base: N = 12·(4·768² + 2·768·3072) = 84,934,656; head e² + e·V
  # = 768² + 768·250,002 = 192,591,360 weights.
  config = config_lib.base(vocab_size=250002)
  assert flops.encoder_matmul_params(config) == 84_934_656
  assert flops.mlm_head_matmul_params(config) == 192_591_360
  # Per real token of a 512-token segment at rate 0.15, 3 x forward:
  # 6·N + 12·12·768·512 + 0.15·6·192,591,360 = 509.6 + 56.6 + 173.3 MFLOP.
  counts = flops.TokenCounts(tokens=1, attended=512, predictions=0.15)
  assert flops.model_train_flops(config, counts) == pytest.approx(
      509_607_936 + 56_623_104 + 173_332_224)


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
