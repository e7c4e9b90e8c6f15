"""XLM-Align's DWA objective: masks, self-labels, pointer loss, the full term."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_xalign import ops
from flax_xalign.data.specials import PROJECT, SpecialTokens
from flax_xalign.errors import UserError
from flax_xalign.models.encoder import Encoder
from flax_xalign.objectives import dwa
from flax_xalign.objectives.pretraining import PretrainingModel

# One row packing two pairs: <s> a a </s> <s> b b b </s> | <s> c c </s> <s> d d </s>, then padding.
TOKENS = [3, 10, 11, 1, 3, 20, 21, 22, 1, 3, 12, 13, 1, 3, 23, 24, 1, 0]
SIDES = [1, 1, 1, 1, 2, 2, 2, 2, 2, 1, 1, 1, 1, 2, 2, 2, 2, 0]
SEGS = [1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 0]
LENGTH = len(TOKENS)


def _batch(rows=1):
  def arr(x):
    return jnp.asarray([x] * rows, jnp.int32)

  positions = [0, 1, 2, 3, 0, 1, 2, 3, 4, 0, 1, 2, 3, 0, 1, 2, 3, 0]
  langs = [1 if s == 1 else 2 if s == 2 else 0 for s in SIDES]
  return {"tokens": arr(TOKENS), "pair_side": arr(SIDES), "segment_ids": arr(SEGS),
          "positions": arr(positions), "lang_ids": arr(langs)}


def test_pair_masks_stay_inside_each_pair_and_skip_specials():
  link_mask, source, target = dwa.pair_masks(_batch(), PROJECT)
  src = np.flatnonzero(np.asarray(source[0]))
  tgt = np.flatnonzero(np.asarray(target[0]))
  assert src.tolist() == [1, 2, 10, 11] and tgt.tolist() == [5, 6, 7, 14, 15]
  expected = np.zeros((LENGTH, LENGTH), bool)
  for i in (1, 2):
    expected[i, [5, 6, 7]] = True
  for i in (10, 11):
    expected[i, [14, 15]] = True
  np.testing.assert_array_equal(np.asarray(link_mask[0]), expected)


def _aligned_hidden(pairs, length=LENGTH, dim=7, seed=0):
  """States where each (i, j) in `pairs` shares one random direction."""
  rng = np.random.default_rng(seed)
  h = rng.normal(scale=0.05, size=(length, dim))
  for i, j in pairs:
    v = rng.normal(size=dim) * 3
    h[i] += v
    h[j] += v
  return jnp.asarray(h[None], jnp.float32)


# The clamped kernel (max(eps, S), no exponent) is too flat to recover a
# planted alignment next to an unaligned token reliably; its exact iterations
# are tested against a NumPy loop in tests/ops. Here it must only stay valid.
@pytest.mark.parametrize("kernel", ["entropic", "clamped"])
@pytest.mark.parametrize("similarity", ["dot", "cosine"])
def test_self_label_recovers_planted_alignment(kernel, similarity):
  gold = {(1, 6), (2, 5), (10, 15), (11, 14)}
  config = dwa.DwaConfig(solver=ops.AlignmentSolver(sinkhorn_kernel=kernel, similarity=similarity))
  links, plan = jax.jit(lambda h, b: dwa.self_label(h, b, config, PROJECT))(_aligned_hidden(gold), _batch())
  found = {tuple(map(int, p)) for p in np.argwhere(np.asarray(links[0]))}
  link_mask, _, _ = dwa.pair_masks(_batch(), PROJECT)
  assert all(link_mask[0, i, j] for i, j in found)
  if kernel == "clamped":
    assert {(10, 15), (11, 14)} <= found  # the square block
    return
  assert gold <= found
  # Extra Itermax links may only attach tokens the intersection left unaligned.
  for i, j in found - gold:
    assert j == 7, (i, j)
  assert np.all(np.asarray(plan.plan)[~np.asarray(link_mask)] == 0)


def test_pointer_loss_matches_numpy_reference():
  rng = np.random.default_rng(1)
  b, n, d = 2, 6, 5
  q = rng.normal(size=(b, n, d)).astype(np.float32)
  k = rng.normal(size=(b, n, d)).astype(np.float32)
  key_mask = rng.random((b, n, n)) < 0.6
  links = (rng.random((b, n, n)) < 0.3) & key_mask
  weights = (rng.random((b, n)) < 0.7).astype(np.float32)
  loss, count, correct, queries = dwa.pointer_loss(jnp.asarray(q), jnp.asarray(k), jnp.asarray(links),
                                                   jnp.asarray(key_mask), jnp.asarray(weights))
  ref_loss = ref_count = ref_correct = ref_queries = 0.0
  for bi in range(b):
    for i in range(n):
      if not weights[bi, i] or not links[bi, i].any():
        continue
      allowed = np.flatnonzero(key_mask[bi, i])
      scores = q[bi, i] @ k[bi, allowed].T / np.sqrt(d)
      logp = scores - np.log(np.sum(np.exp(scores - scores.max()))) - scores.max()
      for t in np.flatnonzero(links[bi, i]):
        ref_loss -= logp[list(allowed).index(t)]
        ref_count += 1
      ref_queries += 1
      ref_correct += bool(links[bi, i, allowed[np.argmax(scores)]])
  np.testing.assert_allclose(float(loss), ref_loss, rtol=1e-5)
  assert (float(count), float(correct), float(queries)) == (ref_count, ref_correct, ref_queries)


def test_default_layer_scales_with_depth():
  assert dwa.default_self_label_layer(12) == 10
  assert dwa.default_self_label_layer(24) == 20
  assert dwa.default_self_label_layer(4) == 3
  assert dwa.default_self_label_layer(1) == 1


def test_bad_config_is_refused():
  with pytest.raises(UserError, match="similarity"):
    ops.AlignmentSolver(similarity="l2")
  with pytest.raises(UserError, match="Sinkhorn kernel"):
    ops.AlignmentSolver(sinkhorn_kernel="exp")
  with pytest.raises(UserError, match="mu must be > 0"):
    ops.AlignmentSolver(mu=0.0)


def test_pair_masks_follow_the_vocabulary_specials():
  # An XLM-R-style layout: <s>=0, </s>=2; ids 3 and 1 are regular text here.
  xlmr = SpecialTokens(bos=0, pad=1, eos=2, unk=3, mask=99, first_regular=4, end_regular=99)
  batch = _batch()
  tokens = np.asarray(batch["tokens"]).copy()
  tokens[tokens == 3], tokens[tokens == 1] = 0, 2
  batch = dict(batch, tokens=jnp.asarray(tokens))
  _, source, target = dwa.pair_masks(batch, xlmr)
  assert np.flatnonzero(np.asarray(source[0])).tolist() == [1, 2, 10, 11]
  assert np.flatnonzero(np.asarray(target[0])).tolist() == [5, 6, 7, 14, 15]


def test_dwa_term_trains_the_pointer_head(tiny_encoder):
  encoder = tiny_encoder.replace(vocab_size=31, pointer_head=True, dropout_rate=0.0)
  model = PretrainingModel(encoder=Encoder(encoder), objectives={"tlm": 1.0, "dwa": 1.0},
                           objective_options={"dwa": dwa.DwaConfig(self_label_layer=1)})
  batch = _batch(rows=3)
  params = jax.tree.map(lambda x: x.unbox() if hasattr(x, "unbox") else x,
                        model.init(jax.random.key(0), batch=1, length=LENGTH),
                        is_leaf=lambda x: hasattr(x, "unbox"))
  assert "pointer_query" in params and "pointer_key" in params

  @jax.jit
  def run(params, rng):
    return jax.value_and_grad(model.loss_fn, has_aux=True)(params, batch, rng)

  # Mask enough that some labelled tokens are queries.
  for seed in range(20):
    (loss, metrics), grads = run(params, jax.random.key(seed))
    if metrics["dwa_queries"] > 0:
      break
  assert metrics["dwa_queries"] > 0, "no masked labelled query in 20 draws"
  assert np.isfinite(float(loss))
  assert metrics["dwa_labels"] >= 3 * 2  # at least one link per pair
  assert 0.0 <= float(metrics["dwa_accuracy"]) <= 1.0
  assert float(metrics["dwa_entropy"]) >= 0.0
  assert float(jnp.abs(grads["pointer_query"]["kernel"]).sum()) > 0
  assert float(jnp.abs(grads["pointer_key"]["kernel"]).sum()) > 0



def test_unknown_objective_options_are_refused(tiny_encoder):
  from flax_xalign.errors import UserError

  encoder = tiny_encoder.replace(vocab_size=31)
  with pytest.raises(UserError, match="not trained"):
    PretrainingModel(encoder=Encoder(encoder), objectives={"mlm": 1.0},
                     objective_options={"dwa": dwa.DwaConfig()})
