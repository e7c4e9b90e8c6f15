"""TCS/SCS with many languages and a pivot, SCS's candidate sets, and the loss of the second pass.

Hand-built assets with three languages A, B and the pivot P (sides A, P@A,
B, P@B, as `assets.lang_vocab` lays them out), checked against what the paper
asks: a token is switched into another language, the pivot's text into each
partner, each pair through its own dictionary; SCS's 'vocabulary'
candidates against a NumPy CSLS over the whole vocabulary; and the TCS/SCS
loss is the MLM loss of the code-switched copy, not of the plain input
(science review, finding 4).
"""

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

V = 41  # regular ids 5..40
LENGTH = 31
A, B, P, OTHER = 1, 2, 3, 4
# Side s: (language id, its language-specific ids, translation of id i (None: none)).
SIDES = [
    (A, range(5, 13), lambda i: i + 16),       # A 5..12 -> P 21..28
    (P, range(21, 29), lambda i: i - 16),      # P@A 21..28 -> A 5..12
    (B, range(13, 21), lambda i: i + 12),      # B 13..20 -> P 25..32
    (P, range(25, 33), lambda i: i - 12),      # P@B 25..32 -> B 13..20
]
OWN = {A: np.arange(5, 13), B: np.arange(13, 21), P: np.arange(21, 33), OTHER: np.arange(33, 41)}


def induced_dictionary(capacity=9):
  n = len(SIDES)
  value = {"vocab_ids": np.zeros((n, capacity), np.int32), "vocab_mask": np.zeros((n, capacity), bool),
           "translation": np.full((n, capacity), -1, np.int32), "score": np.zeros((n, capacity), np.float32),
           "lang_ids": np.asarray([lang for lang, _, _ in SIDES], np.int32)}
  for s, (_, ids, translate) in enumerate(SIDES):
    ids = list(ids)
    value["vocab_ids"][s, :len(ids)] = ids
    value["vocab_mask"][s, :len(ids)] = True
    value["translation"][s, :len(ids)] = [translate(i) for i in ids]
    value["score"][s, :len(ids)] = 0.5
  return value


def lang_vocab(capacity=9):
  d = induced_dictionary(capacity)
  return {"ids": d["vocab_ids"], "mask": d["vocab_mask"], "counts": np.where(d["vocab_mask"], 200, 0).astype(np.int32),
          "lang_ids": d["lang_ids"]}


def make_batch(rows=12, length=LENGTH, seed=0, languages=(A, B, P, P, OTHER, P), words=None):
  """Rows of three packed sentences each; sentence j of row r has language languages[(r + j) % n].

  `words` optionally narrows a language's ids ({lang: ids}).
  """
  words = {**OWN, **(words or {})}
  rng = np.random.default_rng(seed)
  feats = {k: np.zeros((rows, length), np.int32) for k in ("tokens", "lang_ids", "segment_ids", "positions",
                                                          "pair_side")}
  for r in range(rows):
    cursor = 0
    for segment in (1, 2, 3):
      lang = languages[(r + segment) % len(languages)]
      n = int(rng.integers(5, (length - 6) // 3 - 1))
      sentence = np.concatenate([[3], rng.choice(words[lang], n), [1]])
      span = slice(cursor, cursor + len(sentence))
      feats["tokens"][r, span] = sentence
      feats["lang_ids"][r, span] = lang
      feats["segment_ids"][r, span] = segment
      feats["positions"][r, span] = np.arange(len(sentence))
      cursor += len(sentence)
  return {k: jnp.asarray(v) for k, v in feats.items()}


def make_model(objectives, options=None):
  config = tiny_encoder_config(vocab_size=V, max_positions=32, num_languages=5)
  return PretrainingModel(encoder=Encoder(config), objectives=objectives, objective_options=options or {})


def init(model):
  return jax.jit(lambda key: nn.meta.unbox(model.init(key, batch=2, length=LENGTH)))(jax.random.key(1))


def switched(model, name, batch, assets, seeds):
  params = init(model)

  @jax.jit
  def run(p, b, a, seed):
    ctx = model.forward(p, b, jax.random.key(seed), a, train=False)
    return ctx.masked, model.built[name].switch(ctx)

  return params, [run(params, batch, assets, seed) for seed in seeds]


# ----------------------------------------------------------------------------- routing


def test_route_sides_follows_the_language_and_picks_one_partner_per_sentence():
  batch = make_batch(rows=64, seed=1)
  side_langs = jnp.asarray([lang for lang, _, _ in SIDES], jnp.int32)
  lang, seg = np.asarray(batch["lang_ids"]), np.asarray(batch["segment_ids"])
  counts = np.zeros(4)
  for seed in range(4):
    side = np.asarray(jax.jit(cs.route_sides)(batch["lang_ids"], batch["segment_ids"], side_langs,
                                               jax.random.key(seed)))
    assert (side[lang == A] == 0).all() and (side[lang == B] == 2).all()
    assert (side[(lang == OTHER) | (seg == 0)] == -1).all()  # no side has language 4; padding has 0
    for r, segment in zip(*np.nonzero(np.ones((64, 4), bool))):
      here = (seg[r] == segment) & (lang[r] == P)
      if here.any():
        chosen = set(side[r][here].tolist())
        assert len(chosen) == 1 and chosen <= {1, 3}, chosen  # one partner per pivot sentence
        counts[chosen.pop()] += 1
  share = counts[1] / (counts[1] + counts[3])
  assert 0.35 < share < 0.65, counts  # both partners, about equally often


# ----------------------------------------------------------------------------- TCS


def test_tcs_switches_every_language_into_its_partner_through_its_own_pair():
  model = make_model({"mlm": 1.0, "tcs": 1.0})
  batch = make_batch(rows=16, seed=2)
  tokens, lang, seg = (np.asarray(batch[k]) for k in ("tokens", "lang_ids", "segment_ids"))
  into = {A: 0, B: 0, "P->A": 0, "P->B": 0}
  _, results = switched(model, "tcs", batch, {"induced_dictionary": induced_dictionary()}, seeds=range(6))
  for masked, out in results:
    before, after, new_lang = np.asarray(masked.inputs), np.asarray(out.inputs), np.asarray(out.lang_ids)
    changed = before != after
    assert not changed[lang == OTHER].any()
    for r, c in zip(*np.nonzero(changed)):
      t, l = int(tokens[r, c]), int(lang[r, c])
      if l == A:
        assert after[r, c] == t + 16 and new_lang[r, c] == P
        into[A] += 1
      elif l == B:
        assert after[r, c] == t + 12 and new_lang[r, c] == P
        into[B] += 1
      else:  # pivot text: into A or B, one of them for the whole sentence
        here = changed[r] & (seg[r] == seg[r, c])
        targets = {int(x) for x in new_lang[r][here]}
        assert len(targets) == 1
        if targets == {A}:
          assert 21 <= t <= 28 and after[r, c] == t - 16
          into["P->A"] += 1
        else:
          assert targets == {B} and 25 <= t <= 32 and after[r, c] == t - 12
          into["P->B"] += 1
    np.testing.assert_array_equal(new_lang[~changed], lang[~changed])
  assert min(into.values()) > 0, into


# ----------------------------------------------------------------------------- SCS


def _unit(x):
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _radius(q, t, knn):
  sims = np.sort(_unit(q) @ _unit(t).T, axis=1)[:, ::-1]
  return sims[:, :min(knn, t.shape[0])].mean(1)


@pytest.mark.parametrize("candidates", ["batch", "vocabulary"])
def test_scs_candidates_are_the_partner_side_and_match_a_numpy_csls(candidates):
  knn, top = 3, 4
  model = make_model({"mlm": 1.0, "scs": 1.0},
                     {"scs": {"candidates": candidates, "csls_knn": knn, "translation_top_k": top}})
  # Few B and P@B tokens in the batch: 'batch' candidates are a strict subset of the vocabulary.
  batch = make_batch(rows=10, seed=3, languages=(A, P, A, B, P),
                     words={B: np.arange(13, 16), P: np.arange(21, 28)})
  tokens, seg = np.asarray(batch["tokens"]), np.asarray(batch["segment_ids"])
  present = set(tokens[seg > 0].tolist())
  vocab = lang_vocab()
  params, [(masked, out)] = switched(model, "scs", batch, {"lang_vocab": vocab}, seeds=(4,))
  table = np.asarray(params["token_embed"]["embedding"], np.float64)
  sides = [np.asarray(list(ids)) for _, ids, _ in SIDES]
  sets = sides if candidates == "vocabulary" else [np.asarray([i for i in s if i in present]) for s in sides]
  np.testing.assert_array_equal(np.asarray(out.candidates), [len(s) for s in sets])
  if candidates == "batch":
    assert any(len(b) < len(v) for b, v in zip(sets, sides))
  sel, sem = out.selection, out.semantic
  positions, valid = np.asarray(sel.positions), np.asarray(sel.valid)
  slots = positions.shape[1]
  outside = 0
  checked = 0
  for r in range(positions.shape[0]):
    for j in range(slots):
      if not valid[r, j]:
        continue
      i, c = r * slots + j, positions[r, j]
      target = int(sem.target_side[i])
      source = target ^ 1
      assert int(tokens[r, c]) in sides[source]  # the token belongs to its side...
      assert SIDES[source][0] == int(batch["lang_ids"][r, c])  # ...of its own language
      x_hat = np.asarray(sem.x_hat[i], np.float64)[None]
      cands = sets[target]
      cos = (_unit(x_hat) @ _unit(table[cands]).T)[0]
      csls = 2 * cos - _radius(x_hat, table[cands], knn)[0] - _radius(table[cands], table[sets[source]], knn)
      order = np.argsort(-csls, kind="stable")[:top]
      q = np.exp(csls[order] - csls[order].max())
      q /= q.sum()
      k = len(order)
      np.testing.assert_array_equal(np.asarray(sem.target_ids[i])[:k], cands[order])
      np.testing.assert_allclose(np.asarray(sem.q[i])[:k], q, rtol=1e-4, atol=1e-6)
      np.testing.assert_allclose(np.asarray(out.input_embeddings[r, c]), q @ table[cands[order]], rtol=1e-4,
                                 atol=1e-5)
      assert int(out.lang_ids[r, c]) == SIDES[target][0]
      outside += sum(int(t) not in present for t in cands[order])
      checked += 1
  assert checked > 5
  if candidates == "vocabulary":
    assert outside > 0  # translations the batch does not contain
  else:
    assert outside == 0


def test_scs_candidates_option_is_checked():
  with pytest.raises(UserError, match="candidates must be one of 'batch', 'vocabulary'"):
    objectives_base.get("scs", candidates="all")


# ----------------------------------------------------------------------------- the second pass


def _cross_entropy(logits, targets, weights):
  logits = np.asarray(logits, np.float64)
  logp = logits - logits.max(-1, keepdims=True)
  logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
  picked = np.take_along_axis(logp, np.asarray(targets)[..., None], axis=-1)[..., 0]
  w = np.asarray(weights, np.float64)
  return float(-(picked * w).sum() / max(w.sum(), 1.0))


@pytest.mark.parametrize("name, assets", [("tcs", {"induced_dictionary": induced_dictionary()}),
                                          ("scs", {"lang_vocab": lang_vocab()})])
def test_the_loss_is_the_mlm_loss_of_the_code_switched_copy(name, assets):
  model = make_model({"mlm": 1.0, name: 1.0})
  batch = make_batch(rows=8, seed=5)
  # Scaled-up random weights: an untrained tiny model predicts nearly the same thing whatever its input.
  params = jax.tree.map(lambda x: 8.0 * x, init(model))

  @jax.jit
  def parts(p):
    ctx = model.forward(p, batch, jax.random.key(0), assets, train=False)
    sw = model.built[name].switch(ctx)
    out = ctx.apply(p, sw.inputs, lang_ids=sw.lang_ids, positions=batch["positions"],
                    segment_ids=batch["segment_ids"], deterministic=True, input_embeddings=sw.input_embeddings)
    at_masked = jnp.take_along_axis(out.hidden, ctx.masked.positions[..., None], axis=1)
    logits = ctx.apply(p, at_masked, method=Encoder.mlm_logits)
    return (logits, ctx.masked, model.built[name](ctx), model.built["mlm"](ctx), sw.selection.count)

  logits, masked, term, mlm, count = parts(params)
  assert int(np.asarray(count).sum()) > 0
  want = _cross_entropy(logits, masked.targets, masked.weights)
  np.testing.assert_allclose(float(term.loss), want, rtol=1e-5)
  # Not a second pass over the unswitched input (which is what the MLM term scores, train=False).
  assert abs(float(term.loss) - float(mlm.loss)) > 0.01 * float(mlm.loss), (float(term.loss), float(mlm.loss))
