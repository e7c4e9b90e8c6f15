"""XLM-Align's DWA objective: masks, self-labels, pointer loss, the full term."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_xalign import ops
from flax_xalign.data.vocab.specials import PROJECT, SpecialTokens
from flax_xalign.errors import UserError
from flax_xalign.models.encoder import Encoder
from flax_xalign.objectives import dwa
from flax_xalign.objectives.model import PretrainingModel

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
  with pytest.raises(UserError, match="(?i)sinkhorn.kernel"):
    ops.AlignmentSolver(sinkhorn_kernel="exp")
  with pytest.raises(UserError, match="mu must be (a number )?> 0"):
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


# One continuous-layout pair (the released XLM-Align layout): <s> a1 a2 a3 </s> b1 b2 </s>, positions 0..7.
CONT_TOKENS = [3, 10, 11, 12, 1, 20, 21, 1]
CONT_SIDES = [1, 1, 1, 1, 1, 2, 2, 2]


def _continuous_batch():
  arr = lambda x: jnp.asarray([x], jnp.int32)
  return {"tokens": arr(CONT_TOKENS), "pair_side": arr(CONT_SIDES), "segment_ids": arr([1] * 8),
          "positions": arr(list(range(8))), "lang_ids": arr([1] * 5 + [2] * 3)}


def test_pair_masks_with_the_continuous_layout():
  link_mask, source, target = dwa.pair_masks(_continuous_batch(), PROJECT)
  assert np.flatnonzero(np.asarray(source[0])).tolist() == [1, 2, 3]
  assert np.flatnonzero(np.asarray(target[0])).tolist() == [5, 6]  # b's </s> (side 2) is not a target
  assert np.argwhere(np.asarray(link_mask[0])).tolist() == [[i, j] for i in (1, 2, 3) for j in (5, 6)]


def test_dwa_term_by_hand_with_stubbed_states(monkeypatch):
  """Known links and masks: the loss over both directions, on exactly the masked labelled queries."""
  from types import SimpleNamespace

  from flax_xalign.models.encoder import EncoderOutput
  from flax_xalign.objectives.base import StepContext
  from flax_xalign.objectives.masking import MaskedTokens

  batch = _continuous_batch()
  links = np.zeros((1, 8, 8), bool)
  links[0, 1, 6] = links[0, 2, 5] = True  # a1-b2, a2-b1; a3 unaligned
  label_states = jnp.full((1, 8, 5), 0.25)
  calls = []

  def fake_self_label(hidden, batch_, config, specials):
    calls.append(("self_label", hidden))
    return jnp.asarray(links), SimpleNamespace(log_plan=jnp.zeros((1, 8, 8)))

  monkeypatch.setattr(dwa, "self_label", fake_self_label)
  rng = np.random.default_rng(0)
  q = rng.normal(size=(1, 8, 2)).astype(np.float32)
  k = rng.normal(size=(1, 8, 2)).astype(np.float32)
  q[0, 1], q[0, 5] = [1, 0], [0, 1]
  k[0, 5], k[0, 6] = [3, 0], [2, 0]  # a1's keys (target side b1, b2)
  k[0, 1], k[0, 2], k[0, 3] = [0, 1], [0, 3], [0, 0]  # b1's keys (source side a1, a2, a3)
  hidden = jnp.ones((1, 8, 5))

  def apply(params, *args, method=None, **kwargs):
    if method is Encoder.pointer_projections:
      assert args[0] is hidden  # the pointer reads the shared forward pass's last layer
      return jnp.asarray(q), jnp.asarray(k)
    calls.append(("clean", kwargs["up_to_layer"], kwargs["deterministic"]))
    return EncoderOutput(hidden=label_states, all_hidden=None)

  # Masked slots: a1 (labelled), a3 (unlabelled), b1 (labelled); the slot on a2 has weight 0.
  masked = MaskedTokens(inputs=batch["tokens"], positions=jnp.asarray([[1, 3, 5, 2]]),
                        targets=jnp.asarray([[10, 12, 20, 11]]), weights=jnp.asarray([[1.0, 1.0, 1.0, 0.0]]))
  ctx = StepContext(params={}, apply=apply, batch=batch, masked=masked, hidden=hidden, all_hidden=None,
                    logits=jnp.zeros((1, 4, 31)), rng=jax.random.key(0), train=True, specials=PROJECT,
                    num_layers=4)
  term = dwa.DenoisingWordAlignment(config=dwa.DwaConfig(self_label_layer=3))(ctx)
  assert calls[0] == ("clean", 3, True)  # the no-grad pass stops at the self-label layer
  assert calls[1][1] is label_states
  r = math.sqrt(2.0)
  # a1 -> b2 over keys {b1: 3/r, b2: 2/r}; b1 -> a2 over keys {a1: 1/r, a2: 3/r, a3: 0}.
  loss_a1 = -2 / r + math.log(math.exp(3 / r) + math.exp(2 / r))
  loss_b1 = -3 / r + math.log(math.exp(1 / r) + math.exp(3 / r) + 1.0)
  assert float(term.count) == 2.0 and float(term.metrics["queries"]) == 2.0
  np.testing.assert_allclose(float(term.loss_sum), loss_a1 + loss_b1, rtol=1e-6)
  np.testing.assert_allclose(float(term.loss), (loss_a1 + loss_b1) / 2, rtol=1e-6)
  assert float(term.metrics["accuracy"]) == 0.5  # a1's argmax is b1 (miss), b1's is a2 (hit)
  assert float(term.metrics["labels"]) == 2.0


def test_dwa_term_trains_the_pointer_head(tiny_encoder):
  encoder = tiny_encoder.replace(vocab_size=31, pointer_head=True, dropout_rate=0.0)
  model = PretrainingModel(encoder=Encoder(encoder), objectives={"tlm": 1.0, "dwa": 1.0},
                           objective_options={"dwa": dwa.DwaConfig(self_label_layer=1)})
  batch = _batch(rows=3)
  params = jax.jit(lambda key: jax.tree.map(lambda x: x.unbox() if hasattr(x, "unbox") else x,
                                            model.init(key, batch=1, length=LENGTH),
                                            is_leaf=lambda x: hasattr(x, "unbox")))(jax.random.key(0))
  assert "pointer_query" in params and "pointer_key" in params
  grads = jax.jit(jax.grad(lambda p: model.loss_fn(p, batch, jax.random.key(3))[0]))(params)
  # Only the DWA term reads the pointer projections: a gradient there means the term is wired in.
  assert float(jnp.abs(grads["pointer_query"]["kernel"]).sum()) > 0
  assert float(jnp.abs(grads["pointer_key"]["kernel"]).sum()) > 0


def test_unknown_objective_options_are_refused(tiny_encoder):
  from flax_xalign.errors import UserError

  encoder = tiny_encoder.replace(vocab_size=31)
  with pytest.raises(UserError, match="not trained"):
    PretrainingModel(encoder=Encoder(encoder), objectives={"mlm": 1.0},
                     objective_options={"dwa": dwa.DwaConfig()})


def test_separate_sides_by_hand():
  batch = _batch()
  # The continuous layout of the first pair: <s> a a </s> b b b </s> with positions running on.
  continuous = dict(batch, positions=jnp.asarray([[0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 2, 3, 4, 5, 6, 7, 0]]))
  for b in (batch, continuous):
    segments, positions = dwa.separate_sides(b)
    np.testing.assert_array_equal(segments[0], [2, 2, 2, 2, 3, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0])
    np.testing.assert_array_equal(positions[0], [0, 1, 2, 3, 0, 1, 2, 3, 4, 0, 1, 2, 3, 0, 1, 2, 3, 0])


def test_separate_encoding_equals_each_side_encoded_alone(tiny_encoder):
  """The self-label states of a side, encoded separately, are those of the side run on its own."""
  encoder = Encoder(tiny_encoder.replace(vocab_size=31, dropout_rate=0.0, attention_dropout_rate=0.0))
  batch = _batch()
  # Jitted (one program per shape): eager, every op would run and compile on its own.
  params = jax.jit(lambda key: encoder.init(key, batch["tokens"], lang_ids=batch["lang_ids"],
                                            positions=batch["positions"], segment_ids=batch["segment_ids"],
                                            deterministic=True))(jax.random.key(0))
  hidden = jax.jit(lambda p, tokens, lang_ids, positions, segment_ids: encoder.apply(
      p, tokens, lang_ids=lang_ids, positions=positions, segment_ids=segment_ids, deterministic=True).hidden)
  segments, positions = dwa.separate_sides(batch)
  together = hidden(params, batch["tokens"], batch["lang_ids"], positions, segments)
  side_b = slice(4, 9)  # <s> b b b </s> of the first pair.
  alone = hidden(params, batch["tokens"][:, side_b], batch["lang_ids"][:, side_b], batch["positions"][:, side_b],
                 jnp.ones_like(batch["tokens"][:, side_b]))
  np.testing.assert_allclose(together[:, side_b], alone, atol=1e-5)
  joint = hidden(params, batch["tokens"], batch["lang_ids"], batch["positions"], batch["segment_ids"])
  assert not np.allclose(joint[:, side_b], alone, atol=1e-3)  # Joint encoding does see side a.


def test_self_label_encoding_is_validated():
  with pytest.raises(UserError, match="self_label_encoding"):
    dwa.DwaConfig(self_label_encoding="concatenated")


def test_given_links_by_hand():
  batch = _batch()
  # Pair 1: positions 1-5 share group 1, 2-{6, 7} group 2. Pair 2 numbers its own groups: 10-14 share
  # group 1 (never linked to pair 1's group 1), 15's group 2 has no source word.
  groups = [0, 1, 2, 0, 0, 1, 2, 2, 0, 0, 1, 0, 0, 0, 1, 2, 0, 0]
  batch["link_groups"] = jnp.asarray([groups], jnp.int32)
  link_mask, _, _ = dwa.pair_masks(batch, PROJECT)
  got = np.asarray(dwa.given_links(batch, link_mask)[0])
  expected = np.zeros((LENGTH, LENGTH), bool)
  expected[1, 5] = expected[2, 6] = expected[2, 7] = expected[10, 14] = True
  np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("source", ["links", "intersection", "union"])
def test_label_sources_combine_self_labels_with_given_links(monkeypatch, source):
  """What each label source trains on, with stubbed self-labels and a stubbed pointer loss."""
  from types import SimpleNamespace

  from flax_xalign.models.encoder import EncoderOutput
  from flax_xalign.objectives.base import StepContext
  from flax_xalign.objectives.masking import MaskedTokens

  batch = _continuous_batch()
  # Self-labels a1-b2, a2-b1; given links a1-b2 (agrees) and a3-b1 (self-labels miss it).
  self_links = np.zeros((1, 8, 8), bool)
  self_links[0, 1, 6] = self_links[0, 2, 5] = True
  batch["link_groups"] = jnp.asarray([[0, 1, 0, 2, 0, 2, 1, 0]], jnp.int32)
  given = np.zeros((1, 8, 8), bool)
  given[0, 1, 6] = given[0, 3, 5] = True
  calls = []

  def fake_self_label(hidden, batch_, config, specials):
    calls.append("self_label")
    return jnp.asarray(self_links), SimpleNamespace(log_plan=jnp.zeros((1, 8, 8)))

  seen = {}

  def fake_pointer_loss(queries, keys, links, key_mask, query_weights):
    seen["links"] = np.asarray(links)
    return jnp.float32(1.0), jnp.float32(1.0), jnp.float32(0.0), jnp.float32(1.0)

  monkeypatch.setattr(dwa, "self_label", fake_self_label)
  monkeypatch.setattr(dwa, "pointer_loss", fake_pointer_loss)

  def apply(params, *args, method=None, **kwargs):
    if method is Encoder.pointer_projections:
      return args[0], args[0]
    calls.append("clean")
    return EncoderOutput(hidden=jnp.zeros((1, 8, 5)), all_hidden=None)

  masked = MaskedTokens(inputs=batch["tokens"], positions=jnp.asarray([[1]]), targets=jnp.asarray([[10]]),
                        weights=jnp.asarray([[1.0]]))
  ctx = StepContext(params={}, apply=apply, batch=batch, masked=masked, hidden=jnp.ones((1, 8, 5)),
                    all_hidden=None, logits=jnp.zeros((1, 1, 31)), rng=jax.random.key(0), train=True,
                    specials=PROJECT, num_layers=4)
  objective = dwa.DenoisingWordAlignment(config=dwa.DwaConfig(label_source=source))
  assert objective.batch_features == ("link_groups",)
  term = objective(ctx)
  want = {"links": given, "intersection": given & self_links, "union": given | self_links}[source]
  both = want | np.swapaxes(want, 1, 2)  # Queries on both sides, as with self-labels.
  np.testing.assert_array_equal(seen["links"], both)
  assert float(term.metrics["labels"]) == want.sum() and float(term.metrics["given"]) == 2.0
  if source == "links":
    assert calls == []  # No self-labelling pass when nothing of the model's own is used.
  else:
    assert calls == ["clean", "self_label"]
    assert float(term.metrics["agreement"]) == 0.5  # a1-b2 of the two given links.


def test_label_source_is_validated_and_self_needs_no_links():
  with pytest.raises(UserError, match="label_source='eflomal'.*self, links, intersection, union"):
    dwa.DwaConfig(label_source="eflomal")
  assert dwa.DenoisingWordAlignment().batch_features == ()
