"""TCS-MLM and SCS-MLM (objectives/code_switch.py) against hand-built assets and NumPy references."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_xalign.errors import UserError
from flax_xalign.models.encoder import Encoder
from flax_xalign.objectives import base as objectives_base
from flax_xalign.objectives import code_switch as cs
from flax_xalign.objectives.model import PretrainingModel

from tests.testlib import tiny_encoder_config

V = 61  # regular ids 5..60
LENGTH = 29
LANG_A, LANG_B = 1, 2
# Language-specific vocabularies: side 0 (language 1) 5..20, side 1 (language 2) 33..48; 21..32 and
# 49..60 are shared / unlisted. The induced dictionary translates 5 + i <-> 33 + i, except that
# 18..20 (side 0) and 46..48 (side 1) have no translation.
SIDE0 = np.arange(5, 21)
SIDE1 = np.arange(33, 49)
NO_TRANSLATION = {18, 19, 20, 46, 47, 48}


def _translation_of(token):
  if token in NO_TRANSLATION:
    return None
  if 5 <= token <= 20:
    return token + 28
  if 33 <= token <= 48:
    return token - 28
  return None


def induced_dictionary(capacity=18):
  """An `induced_dictionary` value, padded to `capacity` rows per side."""
  ids = np.zeros((2, capacity), np.int32)
  mask = np.zeros((2, capacity), bool)
  translation = np.full((2, capacity), -1, np.int32)
  score = np.zeros((2, capacity), np.float32)
  for s, side in enumerate((SIDE0, SIDE1)):
    ids[s, :len(side)] = side
    mask[s, :len(side)] = True
    for i, token in enumerate(side):
      t = _translation_of(int(token))
      translation[s, i] = -1 if t is None else t
      score[s, i] = 0.0 if t is None else 0.5
  return {"vocab_ids": ids, "vocab_mask": mask, "translation": translation, "score": score,
          "lang_ids": np.asarray([LANG_A, LANG_B], np.int32)}


def lang_vocab(capacity=18):
  ids = np.zeros((2, capacity), np.int32)
  mask = np.zeros((2, capacity), bool)
  for s, side in enumerate((SIDE0, SIDE1)):
    ids[s, :len(side)] = side
    mask[s, :len(side)] = True
  return {"ids": ids, "mask": mask, "counts": np.where(mask, 200, 0).astype(np.int32),
          "lang_ids": np.asarray([LANG_A, LANG_B], np.int32)}


def make_batch(rows=6, length=LENGTH, seed=0, bitext_row=True):
  """Monolingual rows (two packed sentences, language 1 or 2) with padding, plus one translation pair."""
  rng = np.random.default_rng(seed)
  feats = {k: np.zeros((rows, length), np.int32) for k in ("tokens", "lang_ids", "segment_ids", "positions",
                                                          "pair_side")}
  for r in range(rows):
    lang = LANG_A if r % 2 == 0 else LANG_B
    own = np.concatenate([SIDE0 if lang == LANG_A else SIDE1, np.arange(21, 33)])
    cursor = 0
    for segment in (1, 2):
      n = int(rng.integers(4, (length - 6) // 2))
      sentence = np.concatenate([[3], rng.choice(own, n), [1]])
      span = slice(cursor, cursor + len(sentence))
      feats["tokens"][r, span] = sentence
      feats["lang_ids"][r, span] = lang
      feats["segment_ids"][r, span] = segment
      feats["positions"][r, span] = np.arange(len(sentence))
      cursor += len(sentence)
  if bitext_row:  # <s> a </s> <s> b </s>: translatable tokens on both sides, never switched.
    a, b = rng.choice(SIDE0[:10], 8), rng.choice(SIDE1[:10], 8)
    row = np.concatenate([[3], a, [1], [3], b, [1]])
    feats["tokens"][-1] = 0
    feats["tokens"][-1, :len(row)] = row
    feats["lang_ids"][-1] = 0
    feats["lang_ids"][-1, :len(row)] = [LANG_A] * 10 + [LANG_B] * 10
    feats["segment_ids"][-1] = 0
    feats["segment_ids"][-1, :len(row)] = 1
    feats["positions"][-1] = 0
    feats["positions"][-1, :len(row)] = np.r_[np.arange(10), np.arange(10)]
    feats["pair_side"][-1] = 0
    feats["pair_side"][-1, :len(row)] = [1] * 10 + [2] * 10
  return {k: jnp.asarray(v) for k, v in feats.items()}


def make_model(objectives, options=None, **encoder):
  config = tiny_encoder_config(vocab_size=V, **encoder)
  return PretrainingModel(encoder=Encoder(config), objectives=objectives, objective_options=options or {})


def context_reference(batch, masked):
  """NumPy: regular tokens of monolingual rows, not padding, not a real prediction slot."""
  tokens = np.asarray(batch["tokens"])
  ctx = (tokens >= 5) & (np.asarray(batch["pair_side"]) == 0) & (np.asarray(batch["segment_ids"]) > 0)
  positions, weights = np.asarray(masked.positions), np.asarray(masked.weights)
  for r in range(tokens.shape[0]):
    ctx[r, positions[r][weights[r] > 0]] = False
  return ctx


def init(model, length=LENGTH):
  # Jitted: one compile (kept by the persistent cache) instead of every initialiser run eagerly, op by op.
  return jax.jit(lambda key: nn.meta.unbox(model.init(key, batch=2, length=length)))(jax.random.key(1))


def switched(model, name, batch, assets, seeds=(0,), params=None):
  """[(masked, Switched)] of objective `name` for each seed, from one jitted program."""
  params = params if params is not None else init(model)

  @jax.jit
  def run(p, b, a, seed):
    ctx = model.forward(p, b, jax.random.key(seed), a, train=False)
    return ctx.masked, model.built[name].switch(ctx)

  return params, [run(params, batch, assets, seed) for seed in seeds]


# ----------------------------------------------------------------------------- options


@pytest.mark.parametrize("name, kwargs, needle", [
    ("tcs", {"min_rate": 0.2, "max_rate": 0.1}, "min_rate"),
    ("tcs", {"max_rate": 0.0, "min_rate": 0.0}, "max_rate"),
    ("scs", {"max_rate": 1.5}, "max_rate"),
    ("scs", {"top_k": 0}, "top_k"),
    ("scs", {"csls_knn": 2.5}, "csls_knn"),
    ("scs", {"max_candidates": 0}, "max_candidates"),
])
def test_bad_options_are_one_user_error(name, kwargs, needle):
  with pytest.raises(UserError, match=needle):
    objectives_base.get(name, **kwargs)


def test_requires_the_assets_of_the_spec():
  assert objectives_base.get("tcs").requires == ("induced_dictionary",)
  assert objectives_base.get("scs").requires == ("lang_vocab",)
  assert cs.switch_slots(29, 0.15) == math.ceil(0.15 * 29)


# ----------------------------------------------------------------------------- selection


def test_choose_positions_count_formula_and_uniform_subset():
  rows, length = 400, 37
  rng = np.random.default_rng(3)
  context = rng.random((rows, length)) < 0.8
  eligible = context & (rng.random((rows, length)) < 0.5)
  eligible[:40] = False  # rows with nothing eligible
  eligible[40:60] &= np.arange(length)[None, :] < 6  # rows with few eligible
  slots = cs.switch_slots(length, 0.15)
  sel = jax.jit(lambda e, c, k: cs.choose_positions(e, c, k, min_rate=0.1, max_rate=0.15, slots=slots))(
      jnp.asarray(eligible), jnp.asarray(context), jax.random.key(0))
  rate, jitter = np.asarray(sel.rate), np.asarray(sel.jitter)
  assert np.all((rate >= 0.1) & (rate <= 0.15)) and np.all((jitter >= 0) & (jitter < 1))
  n_ctx, n_elig = context.sum(1), eligible.sum(1)
  expected = np.minimum(np.minimum(np.floor(rate * n_ctx + jitter), n_elig), slots).astype(int)
  np.testing.assert_array_equal(np.asarray(sel.count), expected)
  np.testing.assert_array_equal(np.asarray(sel.context), n_ctx)
  positions, valid = np.asarray(sel.positions), np.asarray(sel.valid)
  np.testing.assert_array_equal(valid.sum(1), expected)
  hit = np.zeros(length)
  for r in range(rows):
    chosen = positions[r][valid[r]]
    assert len(set(chosen)) == len(chosen)
    assert eligible[r, chosen].all()
    hit[chosen] += 1
  # Uniform among eligible: over the rows whose positions are all eligible-ish, every column is hit.
  assert (hit[6:] > 0).all()


# ----------------------------------------------------------------------------- TCS


def test_tcs_switches_context_tokens_to_their_translations():
  model = make_model({"mlm": 1.0, "tcs": 1.0})
  batch = make_batch(rows=8)
  tokens, lang = np.asarray(batch["tokens"]), np.asarray(batch["lang_ids"])
  _, results = switched(model, "tcs", batch, {"induced_dictionary": induced_dictionary()}, seeds=range(4))
  for masked, out in results:
    before, after = np.asarray(masked.inputs), np.asarray(out.inputs)
    changed = before != after
    context = context_reference(batch, masked)
    assert not (changed & ~context).any(), "only context tokens change (no slots, specials, padding, pairs)"
    for r, c in zip(*np.nonzero(changed)):
      assert after[r, c] == _translation_of(int(tokens[r, c]))
      assert out.lang_ids[r, c] == (LANG_B if lang[r, c] == LANG_A else LANG_A)
    np.testing.assert_array_equal(np.asarray(out.lang_ids)[~changed], lang[~changed])
    eligible = context & np.vectorize(lambda t: _translation_of(int(t)) is not None)(tokens)
    sel = out.selection
    expected = np.minimum(np.floor(np.asarray(sel.rate) * context.sum(1) + np.asarray(sel.jitter)),
                          eligible.sum(1))
    np.testing.assert_array_equal(changed.sum(1), expected)
    assert changed[-1].sum() == 0  # the translation-pair row


def test_tcs_share_lies_in_the_band_over_many_rows():
  model = make_model({"mlm": 1.0, "tcs": 1.0})
  # Long rows made only of translatable tokens: eligibility never limits the count.
  rows, length = 256, 31
  rng = np.random.default_rng(1)
  tokens = np.full((rows, length), 0, np.int32)
  tokens[:, 0], tokens[:, -1] = 3, 1
  tokens[:, 1:-1] = rng.choice(SIDE0[:13], (rows, length - 2))
  batch = {"tokens": jnp.asarray(tokens), "lang_ids": jnp.full((rows, length), LANG_A, jnp.int32),
           "segment_ids": jnp.ones((rows, length), jnp.int32),
           "positions": jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (rows, length)),
           "pair_side": jnp.zeros((rows, length), jnp.int32)}
  config = tiny_encoder_config(vocab_size=V, max_positions=32)
  model = PretrainingModel(encoder=Encoder(config), objectives={"mlm": 1.0, "tcs": 1.0})
  params = init(model, length)
  _, [(masked, out)] = switched(model, "tcs", batch, {"induced_dictionary": induced_dictionary()}, seeds=(5,),
                                params=params)
  changed = np.asarray(out.inputs) != np.asarray(masked.inputs)
  context = context_reference(batch, masked).sum(1)
  share = changed.sum(1) / context
  assert 0.10 <= share.mean() <= 0.15
  assert abs(share.mean() - 0.125) < 0.01
  assert np.all(share >= 0.10 - 1 / context) and np.all(share <= 0.15 + 1 / context)


def test_tcs_keeps_slots_and_targets_and_without_switches_equals_mlm():
  model = make_model({"mlm": 1.0, "tcs": 1.0})
  batch = make_batch(rows=6)
  empty = induced_dictionary()
  empty["vocab_mask"][:] = False
  empty["translation"][:] = -1
  def both(p, b, a):
    ctx = model.forward(p, b, jax.random.key(0), a, train=False)
    return {name: model.built[name](ctx) for name in ("tcs", "mlm")}

  terms = jax.jit(both)
  out = terms(init(model), batch, {"induced_dictionary": empty})
  term, mlm = out["tcs"], out["mlm"]
  assert float(term.metrics["switched"]) == 0.0 and float(term.metrics["eligible"]) == 0.0
  # Same inputs, deterministic: the second pass is the first, the slots and targets the MLM term's.
  np.testing.assert_allclose(float(term.loss), float(mlm.loss), rtol=1e-6)
  assert float(term.count) == float(mlm.count)


def test_tcs_language_ids_switch_can_be_turned_off():
  model = make_model({"mlm": 1.0, "tcs": 1.0}, {"tcs": {"switch_language_ids": False}})
  batch = make_batch(rows=6)
  _, [(masked, out)] = switched(model, "tcs", batch, {"induced_dictionary": induced_dictionary()})
  assert (np.asarray(out.inputs) != np.asarray(masked.inputs)).any()
  np.testing.assert_array_equal(np.asarray(out.lang_ids), np.asarray(batch["lang_ids"]))


def test_tcs_loss_fn_jits_and_logs_its_metrics():
  model = make_model({"mlm": 1.0, "tcs": 1.0})
  batch = make_batch(rows=6)
  params = init(model)
  assets = {"induced_dictionary": {k: jnp.asarray(v) for k, v in induced_dictionary().items()}}
  grad_fn = jax.jit(jax.value_and_grad(lambda p, k: model.loss_fn(p, batch, k, assets), has_aux=True))
  (loss, metrics), grads = grad_fn(params, jax.random.key(2))
  for key in ("tcs", "tcs_accuracy", "tcs_switched", "tcs_eligible", "tcs_predictions", "mlm"):
    assert np.isfinite(float(metrics[key])), key
  np.testing.assert_allclose(float(loss), float(metrics["mlm"]) + float(metrics["tcs"]), rtol=1e-5)
  assert 0.0 < float(metrics["tcs_switched"]) <= float(metrics["tcs_eligible"]) <= 1.0
  assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))


# ----------------------------------------------------------------------------- SCS: the kernel


def _radius(q, t, knn):
  """r_K: mean of the min(K, |t|) largest cosines of each row of q against t (unit rows)."""
  if t.shape[0] == 0:
    return np.zeros(q.shape[0])
  sims = np.sort(q @ t.T, axis=1)[:, ::-1]
  return sims[:, :min(knn, t.shape[0])].mean(1)


def _unit(x):
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def scs_reference(table, logits, sides, cand_ids, cand_valid, *, top_k, translation_top_k, knn, regular):
  """Eq. 4-7 written out per position in NumPy (float64)."""
  table, logits = np.asarray(table, np.float64), np.asarray(logits, np.float64)
  out = []
  for n in range(logits.shape[0]):
    row = np.where(regular, logits[n], -np.inf)
    top = np.argsort(-row, kind="stable")[:top_k]
    prob = np.exp(row - row.max())
    prob /= prob.sum()
    p = prob[top] / prob[top].sum()
    x_hat = p @ table[top]
    s = sides[n]
    t = 1 - s
    targets = cand_ids[t][cand_valid[t]]
    own = cand_ids[s][cand_valid[s]]
    ty, sy = _unit(table[targets]), _unit(table[own])
    cos = _unit(x_hat[None]) @ ty.T
    r_x = _radius(_unit(x_hat[None]), ty, knn)[0]
    r_y = _radius(ty, sy, knn)
    csls = 2 * cos[0] - r_x - r_y
    order = np.argsort(-csls, kind="stable")[:translation_top_k]
    q = np.exp(csls[order] - csls[order].max())
    q /= q.sum()
    out.append({"p": p, "source_ids": top, "x_hat": x_hat, "target_ids": targets[order], "csls": csls[order],
                "q": q, "y_hat": q @ table[targets[order]]})
  return out


@pytest.mark.parametrize("knn", [2, 10])  # 10 > the valid candidates: r_K averages all of them
def test_semantic_switch_matches_numpy_csls(knn):
  rng = np.random.default_rng(7)
  vocab, embed, n = 23, 5, 6
  table = rng.normal(size=(vocab, embed)).astype(np.float32)
  logits = (3 * rng.normal(size=(n, vocab))).astype(np.float32)
  sides = np.asarray([0, 1, 0, 1, 1, 0], np.int32)
  cand_ids = np.asarray([[5, 7, 9, 11, 0], [14, 15, 17, 19, 20]], np.int32)
  cand_valid = np.asarray([[1, 1, 1, 1, 0], [1, 1, 1, 0, 1]], bool)  # one padding column each
  regular = np.arange(vocab) >= 5
  got = jax.jit(lambda *a: cs.semantic_switch(*a, top_k=4, translation_top_k=3, knn=knn,
                                               regular=jnp.asarray(regular)))(
      jnp.asarray(table), jnp.asarray(logits), jnp.asarray(sides), jnp.asarray(cand_ids),
      jnp.asarray(cand_valid))
  want = scs_reference(table, logits, sides, cand_ids, cand_valid, top_k=4, translation_top_k=3, knn=knn,
                       regular=regular)
  for i, ref in enumerate(want):
    np.testing.assert_array_equal(np.asarray(got.source_ids[i]), ref["source_ids"])
    np.testing.assert_allclose(np.asarray(got.p[i]), ref["p"], rtol=1e-5)
    np.testing.assert_allclose(np.asarray(got.x_hat[i]), ref["x_hat"], rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(got.target_ids[i]), ref["target_ids"])
    np.testing.assert_allclose(np.asarray(got.csls[i]), ref["csls"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got.q[i]), ref["q"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(got.y_hat[i]), ref["y_hat"], rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(np.asarray(got.p).sum(1), 1.0, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(got.q).sum(1), 1.0, rtol=1e-6)
  other = np.where(sides == 0, 1, 0)
  for i in range(n):  # candidates of the other side only
    allowed = set(cand_ids[other[i]][cand_valid[other[i]]].tolist())
    assert set(np.asarray(got.target_ids[i]).tolist()) <= allowed
    assert not set(np.asarray(got.source_ids[i]).tolist()) & set(range(5))  # no special ids in x̂


def test_semantic_switch_with_fewer_candidates_than_k():
  rng = np.random.default_rng(2)
  table = jnp.asarray(rng.normal(size=(13, 4)), jnp.float32)
  logits = jnp.asarray(rng.normal(size=(2, 13)), jnp.float32)
  cand_ids = jnp.asarray([[5, 6, 0, 0], [9, 0, 0, 0]], jnp.int32)
  cand_valid = jnp.asarray([[1, 1, 0, 0], [1, 0, 0, 0]], bool)
  got = jax.jit(lambda *a: cs.semantic_switch(*a, top_k=3, translation_top_k=3, knn=10))(
      table, logits, jnp.asarray([0, 1]), cand_ids, cand_valid)
  np.testing.assert_allclose(np.asarray(got.q[0]), [1.0, 0.0, 0.0])  # side 0 -> the one side-1 candidate
  assert int(got.target_ids[0, 0]) == 9
  np.testing.assert_allclose(np.asarray(got.q[1]).sum(), 1.0, rtol=1e-6)
  assert float(got.q[1, 2]) == 0.0 and set(np.asarray(got.target_ids[1, :2]).tolist()) == {5, 6}
  np.testing.assert_allclose(np.asarray(got.y_hat[0]), np.asarray(table[9]), rtol=1e-6)


def test_batch_candidates_are_the_vocabulary_tokens_present_and_not_padding():
  vocab_value = lang_vocab()
  tokens = np.asarray([[3, 5, 7, 33, 25, 1, 40, 41],   # 40, 41 sit in padding
                       [3, 9, 9, 36, 1, 0, 0, 0]], np.int32)
  segments = np.asarray([[1, 1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0, 0, 0]], np.int32)
  candidates = jax.jit(lambda v, t, s, size: cs.batch_candidates(v, t, s, vocab_size=V, size=size),
                       static_argnums=3)
  ids, valid = candidates(vocab_value, jnp.asarray(tokens), jnp.asarray(segments > 0), 16)
  assert np.asarray(ids)[0][np.asarray(valid)[0]].tolist() == [5, 7, 9]
  assert np.asarray(ids)[1][np.asarray(valid)[1]].tolist() == [33, 36]
  small_ids, small_valid = candidates(vocab_value, jnp.asarray(tokens), jnp.asarray(segments > 0), 2)
  assert small_ids.shape == (2, 2) and np.asarray(small_valid).all()


# ----------------------------------------------------------------------------- SCS: the objective


def test_scs_switch_replaces_embeddings_of_context_positions_only():
  model = make_model({"mlm": 1.0, "scs": 1.0})
  batch = make_batch(rows=8, seed=4)
  params, [(masked, out)] = switched(model, "scs", batch, {"lang_vocab": lang_vocab()}, seeds=(1,))
  sel, sem = out.selection, out.semantic
  rows, slots = sel.positions.shape
  assert out.input_embeddings.shape == (rows, LENGTH, 24)
  assert sem.p.shape == (rows * slots, 8) and sem.q.shape == (rows * slots, 8)
  assert sem.x_hat.shape == sem.y_hat.shape == (rows * slots, 24)
  np.testing.assert_array_equal(np.asarray(out.inputs), np.asarray(masked.inputs))
  table = np.asarray(params["token_embed"]["embedding"])
  lookup = table[np.asarray(masked.inputs)]
  is_switched = np.zeros((rows, LENGTH), bool)
  positions, valid = np.asarray(sel.positions), np.asarray(sel.valid)
  for r in range(rows):
    is_switched[r, positions[r][valid[r]]] = True
  assert is_switched.sum() > 0 and not is_switched[-1].any()
  context = context_reference(batch, masked)
  tokens = np.asarray(batch["tokens"])
  in_vocab = np.isin(tokens, np.r_[SIDE0, SIDE1])
  assert not (is_switched & ~(context & in_vocab)).any()
  emb = np.asarray(out.input_embeddings)
  np.testing.assert_array_equal(emb[~is_switched], lookup[~is_switched])
  present = set(tokens[np.asarray(batch["segment_ids"]) > 0].tolist())
  y_hat, q, targets = np.asarray(sem.y_hat), np.asarray(sem.q), np.asarray(sem.target_ids)
  np.testing.assert_allclose(np.asarray(sem.p).sum(1), 1.0, rtol=1e-5)
  for r in range(rows):
    for s in range(slots):
      if not valid[r, s]:
        continue
      i, c = r * slots + s, positions[r, s]
      np.testing.assert_allclose(emb[r, c], y_hat[i], rtol=1e-6)
      np.testing.assert_allclose(q[i].sum(), 1.0, rtol=1e-5)
      other = SIDE1 if tokens[r, c] in SIDE0 else SIDE0
      used = targets[i][q[i] > 0]
      assert set(used.tolist()) <= set(other.tolist()) & present
      assert out.lang_ids[r, c] == (LANG_B if tokens[r, c] in SIDE0 else LANG_A)
  kept = ~is_switched
  np.testing.assert_array_equal(np.asarray(out.lang_ids)[kept], np.asarray(batch["lang_ids"])[kept])


def test_scs_switches_nothing_when_the_other_language_is_absent():
  model = make_model({"mlm": 1.0, "scs": 1.0})
  batch = make_batch(rows=6, seed=2, bitext_row=False)
  only_a = {k: v[::2] for k, v in batch.items()}  # rows of language 1 only
  _, [(_, out)] = switched(model, "scs", only_a, {"lang_vocab": lang_vocab()})
  assert int(out.selection.count.sum()) == 0
  assert int(out.candidates[1]) == 0 and int(out.candidates[0]) > 0


@pytest.mark.parametrize("through", [False, True])
def test_scs_gradient_through_the_replacement_is_a_switch(through):
  model = make_model({"mlm": 1.0, "scs": 1.0}, {"scs": {"gradient_through_replacement": through}},
                     dropout_rate=0.0)
  batch = make_batch(rows=6, seed=3)
  params = init(model)
  assets = {"lang_vocab": {k: jnp.asarray(v) for k, v in lang_vocab().items()}}
  weights = jax.random.normal(jax.random.key(9), (6, LENGTH, 24))

  def replaced(p):
    ctx = model.forward(p, batch, jax.random.key(0), assets, train=False)
    out = model.built["scs"].switch(ctx)
    switched = jnp.zeros(batch["tokens"].shape, jnp.float32).at[
        jnp.arange(6)[:, None], out.selection.positions].max(out.selection.valid.astype(jnp.float32))
    return jnp.sum(out.input_embeddings * weights * switched[..., None]), switched

  grads, chosen = jax.jit(jax.grad(replaced, has_aux=True))(params)
  assert float(chosen.sum()) > 0
  norms = [float(jnp.abs(g).sum()) for g in jax.tree.leaves(grads)]
  if through:
    assert float(jnp.abs(grads["token_embed"]["embedding"]).sum()) > 0  # through x̂, ŷ and the CSLS weights
    assert float(jnp.abs(grads["mlm_head"]["output_bias"]).sum()) > 0  # through p of the first pass
  else:
    assert max(norms) == 0.0


def test_scs_loss_fn_jits_and_logs_its_metrics():
  model = make_model({"mlm": 1.0, "scs": 1.0})
  batch = make_batch(rows=6, seed=5)
  params = init(model)
  assets = {"lang_vocab": {k: jnp.asarray(v) for k, v in lang_vocab().items()}}
  grad_fn = jax.jit(jax.value_and_grad(lambda p, k: model.loss_fn(p, batch, k, assets), has_aux=True))
  (loss, metrics), grads = grad_fn(params, jax.random.key(2))
  for key in ("scs", "scs_accuracy", "scs_switched", "scs_eligible", "scs_candidates", "scs_q_max",
              "scs_p_max"):
    assert np.isfinite(float(metrics[key])), key
  np.testing.assert_allclose(float(loss), float(metrics["mlm"]) + float(metrics["scs"]), rtol=1e-5)
  assert 0.0 < float(metrics["scs_switched"]) <= float(metrics["scs_eligible"]) <= 1.0
  assert 0.0 < float(metrics["scs_q_max"]) <= 1.0
  assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))
