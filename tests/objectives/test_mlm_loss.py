"""MLM and TLM losses against a hand-computed reference on a tiny batch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_xalign.errors import UserError
from flax_xalign.models.encoder import Encoder
from flax_xalign import objectives
from flax_xalign.objectives.mlm import masked_cross_entropy
from flax_xalign.objectives.model import PretrainingModel
from tests.testlib import tiny_encoder_config

CFG = tiny_encoder_config(vocab_size=61, max_positions=17, dropout_rate=0.0)


def _reference_ce(logits, targets, weights):
  logits = np.asarray(logits, np.float64)
  m = logits.max(-1, keepdims=True)
  logz = np.log(np.exp(logits - m).sum(-1)) + m[..., 0]
  picked = np.take_along_axis(logits, np.asarray(targets)[..., None], -1)[..., 0]
  return float(((logz - picked) * weights).sum()), float(weights.sum())


def test_masked_cross_entropy_matches_reference():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(3, 5, 61)).astype(np.float32)
  targets = rng.integers(0, 61, size=(3, 5))
  weights = (rng.random((3, 5)) > 0.4).astype(np.float32)
  loss, count, correct = masked_cross_entropy(jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(weights))
  ref_loss, ref_count = _reference_ce(logits, targets, weights)
  np.testing.assert_allclose(float(loss), ref_loss, rtol=1e-5)
  assert float(count) == ref_count
  assert float(correct) == float(((logits.argmax(-1) == targets) * weights).sum())


def _init(model):
  import flax.linen as nn

  return jax.jit(lambda k: nn.meta.unbox(model.init(k, batch=1, length=13)))(jax.random.key(0))


def _batch():
  """Row 0: two packed monolingual examples; row 1: one pair; row 2: pair + padding."""
  L = 13
  tokens = np.zeros((3, L), np.int32)
  lang = np.zeros_like(tokens); seg = np.zeros_like(tokens); pos = np.zeros_like(tokens); side = np.zeros_like(tokens)
  rng = np.random.default_rng(1)
  # row 0: <s> w w w w </s> | <s> w w w w w </s>
  tokens[0] = [3, *rng.integers(5, 61, 4), 1, 3, *rng.integers(5, 61, 5), 1]
  seg[0] = [1] * 6 + [2] * 7; lang[0] = [1] * 6 + [2] * 7
  pos[0] = list(range(6)) + list(range(7))
  # row 1: <s> a a a a </s> <s> b b b b b </s>
  tokens[1] = [3, *rng.integers(5, 61, 4), 1, 3, *rng.integers(5, 61, 5), 1]
  seg[1] = 1; lang[1] = [1] * 6 + [2] * 7; pos[1] = list(range(6)) + list(range(7)); side[1] = [1] * 6 + [2] * 7
  # row 2: <s> a a </s> <s> b b b </s> pad pad pad pad
  tokens[2, :9] = [3, *rng.integers(5, 61, 2), 1, 3, *rng.integers(5, 61, 3), 1]
  seg[2, :9] = 1; lang[2, :9] = [2] * 4 + [1] * 5; pos[2, :9] = list(range(4)) + list(range(5))
  side[2, :9] = [1] * 4 + [2] * 5
  return {k: jnp.asarray(v) for k, v in dict(tokens=tokens, lang_ids=lang, segment_ids=seg, positions=pos, pair_side=side).items()}


def test_mlm_and_tlm_terms_against_full_logits_reference():
  model = PretrainingModel(encoder=Encoder(CFG), objectives={"mlm": 1.0, "tlm": 0.5})
  params = _init(model)
  batch = _batch()
  rng = jax.random.key(7)
  loss, metrics = jax.jit(lambda p, b, r: model.loss_fn(p, b, r, train=False))(params, batch, rng)

  # Reference: same masking, logits at *every* position, then pick slots by hand.
  rng_mask, _, _ = jax.random.split(rng, 3)
  masked = jax.jit(model.mask)(batch, rng_mask)

  @jax.jit
  def all_logits(params, inputs):
    out = model.apply(params, inputs, lang_ids=batch["lang_ids"], positions=batch["positions"],
                      segment_ids=batch["segment_ids"], deterministic=True)
    return model.apply(params, out.hidden, method=Encoder.mlm_logits)

  full_logits = np.asarray(all_logits(params, masked.inputs))
  totals = {"mlm": [0.0, 0.0], "tlm": [0.0, 0.0]}
  side = np.asarray(batch["pair_side"])
  for r in range(3):
    for slot in range(masked.positions.shape[1]):
      if masked.weights[r, slot] == 0:
        continue
      p = int(masked.positions[r, slot])
      term = "tlm" if side[r, p] > 0 else "mlm"
      ce, _ = _reference_ce(full_logits[r, p][None], np.array([int(masked.targets[r, slot])]), np.ones(1))
      totals[term][0] += ce
      totals[term][1] += 1
  assert totals["mlm"][1] > 0 and totals["tlm"][1] > 0, "test batch should exercise both terms"
  ref = {k: s / n for k, (s, n) in totals.items()}
  np.testing.assert_allclose(float(metrics["mlm"]), ref["mlm"], rtol=2e-5)
  np.testing.assert_allclose(float(metrics["tlm"]), ref["tlm"], rtol=2e-5)
  np.testing.assert_allclose(float(loss), ref["mlm"] + 0.5 * ref["tlm"], rtol=2e-5)
  assert float(metrics["mlm_predictions"]) == totals["mlm"][1]
  assert float(metrics["tokens"]) == float((np.asarray(batch["segment_ids"]) > 0).sum())


def test_gradients_flow_and_are_finite():
  model = PretrainingModel(encoder=Encoder(CFG), objectives={"mlm": 1.0, "tlm": 1.0})
  params = _init(model)
  grads = jax.jit(jax.grad(lambda p: model.loss_fn(p, _batch(), jax.random.key(1), train=True)[0]))(params)
  leaves = jax.tree.leaves(grads)
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in leaves)
  assert float(jnp.abs(grads["token_embed"]["embedding"]).sum()) > 0


def test_unknown_objective_is_a_clear_error():
  with pytest.raises(UserError, match="Did you mean 'tlm'"):
    objectives.get("tml")


def test_pooled_and_per_term_totals_by_hand():
  from flax_xalign.objectives.base import LossTerm
  from flax_xalign.objectives.model import combine_terms

  terms = {
      "mlm": LossTerm(loss=jnp.float32(2.0), metrics={}, loss_sum=jnp.float32(6.0), count=jnp.float32(3.0)),
      "tlm": LossTerm(loss=jnp.float32(4.0), metrics={}, loss_sum=jnp.float32(4.0), count=jnp.float32(1.0)),
      "align": LossTerm(loss=jnp.float32(-0.5), metrics={}),  # no token counts: always its own mean
  }
  weights = {"mlm": 1.0, "tlm": 1.0, "align": 10.0}
  # per_term: 6/3 + 4/1 + 10 * -0.5 = 2 + 4 - 5 = 1.
  assert float(combine_terms(terms, weights, "per_term")) == pytest.approx(1.0)
  # pooled: (6 + 4) / (3 + 1) - 5 = 2.5 - 5 = -2.5.
  assert float(combine_terms(terms, weights, "pooled")) == pytest.approx(-2.5)
  # pooled with tlm weight 2: (6 + 2 * 4) / 4 - 5 = 3.5 - 5 = -1.5.
  assert float(combine_terms(terms, dict(weights, tlm=2.0), "pooled")) == pytest.approx(-1.5)
  empty = {"mlm": LossTerm(loss=jnp.float32(0.0), metrics={}, loss_sum=jnp.float32(0.0),
                           count=jnp.float32(0.0))}
  assert float(combine_terms(empty, {"mlm": 1.0}, "pooled")) == 0.0  # no prediction: 0, not NaN


def test_pooled_model_loss_is_one_mean_over_mlm_and_tlm_tokens():
  batch = _batch()
  rng = jax.random.key(7)
  per_term = PretrainingModel(encoder=Encoder(CFG), objectives={"mlm": 1.0, "tlm": 1.0})
  pooled = PretrainingModel(encoder=Encoder(CFG), objectives={"mlm": 1.0, "tlm": 1.0},
                            loss_normalization="pooled")
  params = _init(per_term)
  loss_a, m = jax.jit(lambda p: per_term.loss_fn(p, batch, rng, train=False))(params)
  loss_b, m_b = jax.jit(lambda p: pooled.loss_fn(p, batch, rng, train=False))(params)
  n_mlm, n_tlm = float(m["mlm_predictions"]), float(m["tlm_predictions"])
  assert n_mlm > 0 and n_tlm > 0 and n_mlm != n_tlm
  mlm, tlm = float(m["mlm"]), float(m["tlm"])
  np.testing.assert_allclose(float(loss_a), mlm + tlm, rtol=1e-6)
  np.testing.assert_allclose(float(loss_b), (mlm * n_mlm + tlm * n_tlm) / (n_mlm + n_tlm), rtol=1e-6)
  assert float(m_b["mlm"]) == mlm and float(m_b["tlm"]) == tlm  # terms are still logged as their means
  with pytest.raises(UserError, match="loss_normalization"):
    PretrainingModel(encoder=Encoder(CFG), objectives={"mlm": 1.0}, loss_normalization="sum")
