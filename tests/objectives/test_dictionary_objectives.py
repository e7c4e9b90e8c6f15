"""ALIGN and DICT-MLM terms against references on tiny batches."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from flax_xalign.assets.base import check_fingerprint
from flax_xalign.assets.dictionary import SyntheticDictionary
from flax_xalign.data.transforms import dictionary as dictionary_lib
from flax_xalign.data.vocab.specials import PROJECT
from flax_xalign.data.transforms.synthetic import SyntheticLanguage
from flax_xalign.errors import UserError
from flax_xalign.objectives.base import CorruptionContext
from flax_xalign.models.encoder import Encoder
from flax_xalign.objectives.align_mlm import align
from flax_xalign.objectives.dict_mlm import dict_mlm
from flax_xalign.objectives.masking import MaskedTokens
from flax_xalign.objectives.model import MaskingConfig, PretrainingModel

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


def _dictionary(pairs, lang_ids=(1, 2)):
  """A `dictionary` asset value as the step receives it."""
  pairs = np.asarray(pairs, np.int32)
  return {"pairs": jnp.asarray(pairs), "mask": jnp.ones(len(pairs), bool), "lang_ids": jnp.asarray(lang_ids)}


def test_dictionary_asset_saves_loads_and_refuses_other_languages(tmp_path):
  language = SyntheticLanguage(transforms="trans", vocab_size=V, seed=0)
  asset = SyntheticDictionary(language, rate=0.5, lang_ids=(1, 2), piece=lambda i: f"p{i}")
  run = type("Run", (), {"seed": 1})()
  value = asset.build(run)
  np.testing.assert_array_equal(value["pairs"], dictionary_lib.draw(language.id_map(), rate=0.5, seed=1))
  asset.save(str(tmp_path), value)
  lines = (tmp_path / "dictionary.tsv").read_text().splitlines()
  assert lines[0] == "natural_id\tderived_id\tpiece" and len(lines) == 1 + len(value["pairs"])
  assert all(line.split("\t")[2] == f"p{line.split(chr(9))[0]}" for line in lines[1:])
  loaded = asset.load(str(tmp_path))
  assert asset.fingerprint(loaded) == asset.fingerprint(value)
  asset.check(loaded, run)
  other = SyntheticDictionary(SyntheticLanguage(transforms="trans", vocab_size=V + 2, seed=0), rate=0.5,
                              lang_ids=(1, 2))
  with pytest.raises(UserError, match="does not match this run's synthetic language"):
    other.check(loaded, run)
  (tmp_path / "bad.tsv").write_text("natural_id\tderived_id\tpiece\n5\tx\n")
  with pytest.raises(UserError, match="bad.tsv:2"):
    dictionary_lib.load(str(tmp_path / "bad.tsv"))


def test_a_hand_edited_dictionary_is_refused_by_its_fingerprint(tmp_path):
  # What a resumed run does with MODEL_DIR's and the step directory's copies (the slow
  # tests/tasks/test_synthetic_tasks.py::test_dict_mlm_killed_hard_... does it through real runs).
  language = SyntheticLanguage(transforms="trans", vocab_size=V, seed=0)
  asset = SyntheticDictionary(language, rate=0.5, lang_ids=(1, 2), piece=lambda i: f"p{i}")
  value = asset.build(type("Run", (), {"seed": 1})())
  asset.save(str(tmp_path), value)
  recorded = asset.fingerprint(value)
  check_fingerprint(asset, asset.load(str(tmp_path)), recorded, where=str(tmp_path))  # Untouched: accepted.
  path = tmp_path / "dictionary.tsv"
  header, first, *rest = path.read_text().splitlines()
  natural, derived, piece = first.split("\t")
  for edited in ([header, f"{natural}\t{int(derived) + 1}\t{piece}", *rest], [header, first, *rest[:-1]]):
    path.write_text("\n".join(edited) + "\n")
    with pytest.raises(UserError, match="was changed after the run wrote it") as info:
      check_fingerprint(asset, asset.load(str(tmp_path)), recorded, where=str(tmp_path))
    assert "dictionary.tsv" in str(info.value) and str(tmp_path) in str(info.value)


def test_align_loss_is_minus_mean_cosine():
  rng = np.random.default_rng(0)
  table = rng.normal(size=(2 * V, 4)).astype(np.float32)
  pairs = np.array([[5, 18], [7, 20], [12, 25]])
  term = align()
  assert term.requires == ("dictionary",)
  ctx = type("Ctx", (), {"params": {"token_embed": {"embedding": jnp.asarray(table)}},
                         "assets": {"dictionary": _dictionary(pairs)}})()
  out = term(ctx)
  ref = np.mean([table[a] @ table[b] / np.linalg.norm(table[a]) / np.linalg.norm(table[b]) for a, b in pairs])
  np.testing.assert_allclose(float(out.loss), -ref, rtol=1e-6)
  # Capacity padding: masked rows do not count.
  padded = _dictionary(np.concatenate([pairs, [[6, 19], [0, 0]]]))
  padded["mask"] = jnp.asarray([True, True, True, False, False])
  ctx.assets = {"dictionary": padded}
  np.testing.assert_allclose(float(term(ctx).loss), -ref, rtol=1e-6)
  assert float(term(ctx).metrics["pairs"]) == 3


def test_dict_mlm_swaps_half_of_eligible_slots_keeps_labels():
  pairs = np.array([[5, 18], [6, 19], [7, 20]])
  term = dict_mlm()
  b, length, p = 64, 9, 3
  tokens = np.tile(np.array([3, 5, 6, 7, 8, 19, 9, 1, 0]), (b, 1))
  positions = np.tile(np.array([1, 4, 5]), (b, 1))  # tokens 5 (in dict), 8 (not), 19 (derived, in dict)
  masked = MaskedTokens(inputs=jnp.asarray(np.where(np.isin(np.arange(length), [1, 4, 5]), 4, tokens)),
                        positions=jnp.asarray(positions), targets=jnp.asarray(tokens[:, [1, 4, 5]]),
                        weights=jnp.ones((b, p)))
  lang = jnp.asarray(np.tile(np.array([1, 1, 1, 1, 1, 2, 1, 1, 0]), (b, 1)))
  ctx = CorruptionContext(params={}, assets={"dictionary": _dictionary(pairs)}, rng=jax.random.key(0), batch={},
                          masked=masked, lang_ids=lang, input_embeddings=None, specials=PROJECT,
                          vocab_size=2 * V, train=True)
  out = term.corrupt(ctx)
  new = out.masked
  inputs, new_lang = np.asarray(new.inputs), np.asarray(out.lang_ids)
  np.testing.assert_array_equal(np.asarray(new.targets), tokens[:, [1, 4, 5]])  # labels unchanged
  assert set(inputs[:, 1]) == {4, 18} and set(inputs[:, 5]) == {4, 6}
  # No entry (token 8): a "translate" slot shows the original token (paper G.4), the others <mask>.
  assert set(inputs[:, 4]) == {4, 8}
  assert 0.3 < (inputs[:, 4] == 8).mean() < 0.7
  swapped = inputs[:, 1] == 18
  assert 0.3 < swapped.mean() < 0.7
  np.testing.assert_array_equal(new_lang[swapped, 1], 2)
  np.testing.assert_array_equal(new_lang[inputs[:, 5] == 6, 5], 1)
  np.testing.assert_array_equal(new_lang[:, 4], 1)
  np.testing.assert_array_equal(inputs[:, [0, 2, 3, 6, 7, 8]], tokens[:, [0, 2, 3, 6, 7, 8]])
  # The switch keeps the shared corruption (<mask> here) on untranslatable slots.
  corrupt = dict_mlm(untranslatable="corrupt").corrupt(ctx)
  assert set(np.asarray(corrupt.masked.inputs)[:, 4]) == {4}
  with pytest.raises(UserError, match="untranslatable"):
    dict_mlm(untranslatable="keep")


def _one_row_ctx(tokens, lang, positions, shown, vocab_copies=2, seed=0):
  """A CorruptionContext over one row whose masked slots currently show `shown`."""
  tokens = np.asarray(tokens)
  positions = np.asarray(positions)
  inputs = tokens.copy()
  inputs[positions] = shown
  masked = MaskedTokens(inputs=jnp.asarray(inputs[None]), positions=jnp.asarray(positions[None]),
                        targets=jnp.asarray(tokens[positions][None]), weights=jnp.ones((1, len(positions))))
  # V = 13 pieces doubled: natural regular ids 5..12, derived 18..25; 13..17 are unused.
  return CorruptionContext(params={}, assets={"dictionary": _dictionary([[5, 18], [6, 19]])},
                           rng=jax.random.key(seed), batch={}, masked=masked,
                           lang_ids=jnp.asarray(np.asarray(lang)[None]), input_embeddings=None,
                           specials=PROJECT, vocab_size=2 * V, train=True, vocab_copies=vocab_copies)


def test_dict_mlm_random_replacements_stay_in_the_examples_language_copy():
  # Two packed examples: natural (lang 1) `<s> 7 9 </s>` and derived (lang 2) `<s> 20 7 22 </s>`,
  # where 7 is a token both languages share. Slots 1, 2, 6, 7 show random ids from the shared masking
  # (14 and 15 are copies of special ids, which no language has; 21 and 9 are the wrong language).
  tokens = [3, 7, 9, 1, 3, 20, 7, 22, 1]
  lang = [1, 1, 1, 1, 2, 2, 2, 2, 2]
  positions = [1, 2, 6, 7]
  term = dict_mlm(swap_rate=0.0)  # No translate slots: only the redraw acts.
  seen = {p: set() for p in positions}
  for seed in range(40):
    out = term.corrupt(_one_row_ctx(tokens, lang, positions, shown=[14, 21, 15, 9], seed=seed))
    row = np.asarray(out.masked.inputs)[0]
    for p in positions:
      seen[p].add(int(row[p]))
    np.testing.assert_array_equal(np.asarray(out.lang_ids)[0], lang)
  natural, derived = set(range(5, 13)), set(range(18, 26))
  assert seen[1] <= natural and seen[2] <= natural
  # The shared token 7 inside the derived example is replaced by a derived id too.
  assert seen[6] <= derived and seen[7] <= derived
  assert len(seen[1] | seen[2]) >= 6 and len(seen[6] | seen[7]) >= 6  # spread over the range
  # <mask> and unchanged slots are not random replacements: left alone.
  out = term.corrupt(_one_row_ctx(tokens, lang, positions, shown=[4, 9, 4, 22]))
  np.testing.assert_array_equal(np.asarray(out.masked.inputs)[0, positions], [4, 9, 4, 22])


def test_shared_masking_draws_random_ids_from_the_tokens_copy(tiny_encoder):
  encoder = tiny_encoder.replace(vocab_size=2 * V)
  masking = MaskingConfig(mask_rate=0.5, replace_with_mask_rate=0.0, replace_with_random_rate=1.0)
  tokens = np.array([[3, 5, 6, 7, 8, 9, 10, 11, 12, 1], [3, 18, 19, 20, 21, 22, 23, 24, 25, 1]], np.int32)
  for copies, allowed in ((2, (set(range(5, 13)), set(range(18, 26)))), (1, (set(range(5, 26)),) * 2)):
    model = PretrainingModel(encoder=Encoder(encoder), objectives={"mlm": 1.0}, masking=masking,
                             vocab_copies=copies)
    drawn = [set(), set()]
    mask = jax.jit(model.mask)  # One program for the 30 draws (eager, each would run op by op).
    for seed in range(30):
      masked = mask({"tokens": jnp.asarray(tokens)}, jax.random.key(seed))
      inputs, pos, w = map(np.asarray, (masked.inputs, masked.positions, masked.weights))
      for r in range(2):
        drawn[r] |= set(inputs[r, pos[r][w[r] > 0]].tolist())
    assert drawn[0] <= allowed[0] and drawn[1] <= allowed[1], (copies, drawn)
    if copies == 1:  # One copy: the whole regular range, the unused ids 13..17 included.
      assert drawn[0] & set(range(13, 18))


def test_align_mlm_model_trains_embeddings_toward_dictionary(tiny_encoder):
  encoder = tiny_encoder.replace(vocab_size=2 * V, num_languages=0)
  pairs = np.array([[5, 18], [6, 19]])
  model = PretrainingModel(encoder=Encoder(encoder), objectives={"mlm": 1.0, "align": 10.0})
  assets = {"dictionary": _dictionary(pairs)}
  # Init and the whole update jitted: eager, op by op, they cost several times the compile.
  params = jax.jit(lambda key: jax.tree.map(lambda x: x.unbox() if hasattr(x, "unbox") else x,
                                            model.init(key, batch=1, length=7),
                                            is_leaf=lambda x: hasattr(x, "unbox")))(jax.random.key(0))
  batch = {k: jnp.asarray(np.tile(v, (2, 1)), jnp.int32) for k, v in {
      "tokens": [3, 5, 6, 7, 8, 1, 0], "lang_ids": [1, 1, 1, 1, 1, 1, 0], "segment_ids": [1] * 6 + [0],
      "positions": list(range(6)) + [0], "pair_side": [0] * 7}.items()}
  tx = optax.adam(3e-3)

  @jax.jit
  def step(params, state):
    loss_fn = lambda p: model.loss_fn(p, batch, jax.random.key(1), assets)
    (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state, metrics["align"]

  state = tx.init(params)
  aligns = []
  for _ in range(11):
    params, state, align_term = step(params, state)
    aligns.append(float(align_term))  # The term at the parameters before this update.
  before, after = aligns[0], aligns[-1]  # Before any update, after ten.
  assert after < before - 0.1
