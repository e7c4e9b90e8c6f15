"""ALIGN and DICT-MLM terms against references on tiny batches."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from flax_xalign.data import dictionary as dictionary_lib
from flax_xalign.errors import UserError
from flax_xalign.models.encoder import Encoder
from flax_xalign.objectives import dictionary_objectives as dobj
from flax_xalign.objectives.masking import MaskedTokens
from flax_xalign.objectives.pretraining import PretrainingModel

V = 13


def _id_map():
  m = np.arange(V)
  m[5:] += V
  return m


def test_draw_is_seeded_exact_and_skips_specials_and_shared(tmp_path):
  id_map = _id_map()
  id_map[6] = 6  # shared
  pairs = dictionary_lib.draw(id_map, rate=0.5, seed=3)
  assert len(pairs) == round(0.5 * 7)
  assert set(pairs[:, 0]) <= set(range(5, V)) - {6}
  np.testing.assert_array_equal(pairs[:, 1], id_map[pairs[:, 0]])
  np.testing.assert_array_equal(pairs, dictionary_lib.draw(id_map, rate=0.5, seed=3))
  assert not np.array_equal(pairs, dictionary_lib.draw(id_map, rate=0.5, seed=4))


def test_ensure_saves_once_and_reloads_never_redraws(tmp_path):
  first = dictionary_lib.ensure(str(tmp_path), _id_map(), rate=0.25, seed=1)
  text = (tmp_path / "dictionary.tsv").read_text()
  assert text.startswith("natural_id\tderived_id\tpiece\n")
  again = dictionary_lib.ensure(str(tmp_path), _id_map(), rate=0.5, seed=99)
  np.testing.assert_array_equal(first, again)
  other = np.arange(V)
  other[5:] += 2 * V
  with pytest.raises(UserError, match="does not match"):
    dictionary_lib.ensure(str(tmp_path), other, rate=0.25, seed=1)
  (tmp_path / "bad.tsv").write_text("natural_id\tderived_id\tpiece\n5\tx\n")
  with pytest.raises(UserError, match="bad.tsv:2"):
    dictionary_lib.load(str(tmp_path / "bad.tsv"))


def test_align_loss_is_minus_mean_cosine():
  rng = np.random.default_rng(0)
  table = rng.normal(size=(2 * V, 4)).astype(np.float32)
  pairs = np.array([[5, 18], [7, 20], [12, 25]])
  term = dobj.align(dictionary=pairs)
  ctx = type("Ctx", (), {"params": {"token_embed": {"embedding": jnp.asarray(table)}}})()
  out = term(ctx)
  ref = np.mean([table[a] @ table[b] / np.linalg.norm(table[a]) / np.linalg.norm(table[b]) for a, b in pairs])
  np.testing.assert_allclose(float(out.loss), -ref, rtol=1e-6)
  with pytest.raises(UserError, match="needs a bilingual dictionary"):
    dobj.align(dictionary=None)


def test_dict_mlm_swaps_half_of_eligible_slots_keeps_labels():
  pairs = np.array([[5, 18], [6, 19], [7, 20]])
  term = dobj.dict_mlm(dictionary=pairs, vocab_size=2 * V, first_derived_id=V,
                       natural_lang_id=1, derived_lang_id=2)
  b, length, p = 64, 9, 3
  tokens = np.tile(np.array([3, 5, 6, 7, 8, 19, 9, 1, 0]), (b, 1))
  positions = np.tile(np.array([1, 4, 5]), (b, 1))  # tokens 5 (in dict), 8 (not), 19 (derived, in dict)
  masked = MaskedTokens(inputs=jnp.asarray(np.where(np.isin(np.arange(length), [1, 4, 5]), 4, tokens)),
                        positions=jnp.asarray(positions), targets=jnp.asarray(tokens[:, [1, 4, 5]]),
                        weights=jnp.ones((b, p)))
  lang = jnp.asarray(np.tile(np.array([1, 1, 1, 1, 1, 2, 1, 1, 0]), (b, 1)))
  new, new_lang = term.corrupt({}, masked, lang, jax.random.key(0))
  inputs, new_lang = np.asarray(new.inputs), np.asarray(new_lang)
  np.testing.assert_array_equal(np.asarray(new.targets), tokens[:, [1, 4, 5]])  # labels unchanged
  assert set(inputs[:, 1]) == {4, 18} and set(inputs[:, 5]) == {4, 6}
  assert set(inputs[:, 4]) == {4}  # no entry: never swapped
  swapped = inputs[:, 1] == 18
  assert 0.3 < swapped.mean() < 0.7
  np.testing.assert_array_equal(new_lang[swapped, 1], 2)
  np.testing.assert_array_equal(new_lang[inputs[:, 5] == 6, 5], 1)
  np.testing.assert_array_equal(inputs[:, [0, 2, 3, 6, 7, 8]], tokens[:, [0, 2, 3, 6, 7, 8]])


def test_align_mlm_model_trains_embeddings_toward_dictionary(tiny_encoder):
  encoder = tiny_encoder.replace(vocab_size=2 * V, num_languages=0)
  pairs = np.array([[5, 18], [6, 19]])
  model = PretrainingModel(encoder=Encoder(encoder), objectives={"mlm": 1.0, "align": 10.0},
                           objective_options={"align": {"dictionary": pairs}})
  params = jax.tree.map(lambda x: x.unbox() if hasattr(x, "unbox") else x,
                        model.init(jax.random.key(0), batch=1, length=7), is_leaf=lambda x: hasattr(x, "unbox"))
  batch = {k: jnp.asarray(np.tile(v, (2, 1)), jnp.int32) for k, v in {
      "tokens": [3, 5, 6, 7, 8, 1, 0], "lang_ids": [1, 1, 1, 1, 1, 1, 0], "segment_ids": [1] * 6 + [0],
      "positions": list(range(6)) + [0], "pair_side": [0] * 7}.items()}
  loss_grad = jax.jit(jax.value_and_grad(lambda p: model.loss_fn(p, batch, jax.random.key(1))[0]))
  (_, metrics) = model.loss_fn(params, batch, jax.random.key(1))
  before = float(metrics["align"])
  tx = optax.adam(3e-3)
  state = tx.init(params)
  for _ in range(10):
    _, g = loss_grad(params)
    updates, state = tx.update(g, state)
    params = optax.apply_updates(params, updates)
  after = float(model.loss_fn(params, batch, jax.random.key(1))[1]["align"])
  assert after < before - 0.1
