"""Alignment score against a brute-force NumPy computation."""

import jax
import numpy as np
import pytest

from flax_xalign.evaluation import alignment_score as score_lib


def _id_map(v, shared=()):
  m = np.arange(v)
  regular = np.arange(5, v)
  m[regular] = regular + v
  m[list(shared)] = list(shared)
  return m


def _brute(table, id_map, dictionary=None):
  ids = np.arange(len(id_map))
  queries = ids[(ids >= 5) & (id_map != ids)]
  cands = np.unique(id_map[ids >= 5])
  unit = table / np.linalg.norm(table, axis=1, keepdims=True)
  hits = []
  for i in queries:
    sims = unit[cands] @ unit[i]
    hits.append(cands[int(np.argmax(sims))] == id_map[i])
  hits = np.array(hits)
  held = np.ones(len(queries), bool) if dictionary is None else ~np.isin(queries, dictionary[:, 0])
  return hits.mean(), hits[held].mean()


def test_matches_brute_force_with_partial_alignment_and_overlap():
  rng = np.random.default_rng(0)
  v, e = 23, 6
  id_map = _id_map(v, shared=(7, 11))
  table = rng.normal(size=(2 * v, e)).astype(np.float32)
  # Align half of the translatable tokens: counterpart = same vector + noise.
  for i in range(5, v, 2):
    if id_map[i] != i:
      table[id_map[i]] = table[i] + 0.01 * rng.normal(size=e)
  dictionary = np.array([[5, id_map[5]], [9, id_map[9]], [12, id_map[12]]])
  got = score_lib.alignment_score(table, id_map, dictionary=dictionary, block=4)
  want_all, want_held = _brute(table, id_map, dictionary)
  assert got["count_all"] == v - 5 - 2 and got["count_heldout"] == got["count_all"] - 3
  np.testing.assert_allclose(got["all"], want_all)
  np.testing.assert_allclose(got["heldout"], want_held)
  assert 0.3 < got["all"] < 0.8


def test_perfect_and_monitor_agree():
  v, e = 17, 5
  id_map = _id_map(v)
  rng = np.random.default_rng(1)
  table = rng.normal(size=(2 * v, e)).astype(np.float32)
  table[v + 5:] = table[5:v]
  assert score_lib.alignment_score(table, id_map)["all"] == 1.0
  # The ALIGN objective's jitted monitor, on the assets, agrees.
  from flax_xalign.assets.token_map import token_map_of
  from flax_xalign.objectives import align_mlm

  assets = {"token_map": token_map_of(id_map, 5),
            "dictionary": {"pairs": np.array([[6, v + 6]], np.int32), "mask": np.ones(1, bool),
                           "lang_ids": np.array([1, 2], np.int32)}}
  out = jax.jit(align_mlm.align().monitor)({"token_embed": {"embedding": table}}, assets)
  assert float(out["alignment_all"]) == 1.0 and float(out["alignment_heldout"]) == 1.0


def test_monitor_matches_numpy_score_on_a_partial_alignment():
  from flax_xalign.assets.token_map import token_map_of
  from flax_xalign.objectives import align_mlm

  rng = np.random.default_rng(3)
  v, e = 29, 6
  id_map = _id_map(v, shared=(8,))
  table = rng.normal(size=(2 * v, e)).astype(np.float32)
  for i in range(5, v, 3):
    table[id_map[i]] = table[i] + 0.01 * rng.normal(size=e)
  dictionary = np.array([[5, id_map[5]], [11, id_map[11]], [13, id_map[13]]], np.int32)
  assets = {"token_map": token_map_of(id_map, 5),
            "dictionary": {"pairs": dictionary, "mask": np.ones(3, bool), "lang_ids": np.array([1, 2])}}
  out = jax.jit(align_mlm.align().monitor)({"token_embed": {"embedding": table}}, assets)
  want_all, want_held = _brute(table, id_map, dictionary)
  np.testing.assert_allclose(float(out["alignment_all"]), want_all, rtol=1e-6)
  np.testing.assert_allclose(float(out["alignment_heldout"]), want_held, rtol=1e-6)


def test_three_tokens_by_hand():
  # V = 8: ids 0..4 special, natural tokens 5, 6, 7, derived counterparts 13, 14, 15.
  id_map = _id_map(8)
  table = np.random.default_rng(0).normal(size=(16, 2)).astype(np.float32)  # specials: never scored
  table[[5, 6, 7]] = [[1, 0], [0, 1], [1, 1]]
  table[[13, 14, 15]] = [[1, 0.1], [1, 0.9], [-1, 1]]
  # Cosines (rows: queries 5, 6, 7; columns: candidates 13, 14, 15):
  #   5: 0.995  0.743 -0.707 -> 13, right
  #   6: 0.100  0.669  0.707 -> 15, wrong (wants 14)
  #   7: 0.774  0.999  0.000 -> 14, wrong (wants 15)
  got = score_lib.alignment_score(table, id_map, dictionary=np.array([[6, 14]]), block=2)
  assert got["count_all"] == 3 and got["count_heldout"] == 2
  assert got["all"] == pytest.approx(1 / 3)
  assert got["heldout"] == pytest.approx(1 / 2)  # tokens 5 (right) and 7 (wrong)
