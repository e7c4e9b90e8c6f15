"""MUSE cosine and translation analogies against hand computations and brute-force loops."""

import itertools

import numpy as np
import pytest

from flax_xalign.evaluation.lexicon import isomorphism
def _cos(a, b):
  return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


# ------------------------------------------------------------ pieces


# A fake tokeniser: word -> ids; 9 is the unknown piece.
PIECES = {"haus": (4,), "house": (7, 8), "hund": (5, 6), "dog": (10,), "das": (11,), "the": (12,), "xyz": (13, 9),
          "leer": (), "haus2": (4,), "dem": (11,)}


def test_pieces_from_lexicon_keeps_every_listed_pair_and_counts_skips():
  lexicon = {"HAUS": ["house", "dog"], "hund": ["dog", "xyz"], "leer": ["the"], "das": ["the", "leer"],
             "haus2": ["house"], "dem": ["the"]}
  pieces = isomorphism.pieces_from_lexicon(lexicon, encode=lambda w: PIECES[w], unknown_id=9, normalize=str.lower)
  # 9 pairs listed; skipped: hund-xyz (target has the unknown piece), leer-the (empty source), das-leer (empty
  # target). Kept, in order: haus-house, haus-dog, hund-dog, das-the, haus2-house, dem-the.
  assert pieces.given == 9 and pieces.pairs == 6 and pieces.coverage == pytest.approx(6 / 9)
  assert pieces.skipped == {"source_empty": 1, "source_unknown_piece": 0, "target_empty": 1,
                            "target_unknown_piece": 1}
  assert pieces.examples == {"source_empty": ("leer",), "target_empty": ("leer",), "target_unknown_piece": ("xyz",)}
  np.testing.assert_array_equal(pieces.src, [[4, -1], [4, -1], [5, 6], [11, -1], [4, -1], [11, -1]])
  np.testing.assert_array_equal(pieces.tgt, [[7, 8], [10, -1], [10, -1], [12, -1], [7, 8], [12, -1]])
  # haus and haus2 (and das and dem) are the same pieces, so one word each.
  np.testing.assert_array_equal(pieces.src_word, [0, 0, 1, 2, 0, 2])
  np.testing.assert_array_equal(pieces.tgt_word, [0, 1, 1, 2, 0, 2])
  np.testing.assert_array_equal(pieces.piece_ids(0), [4, 5, 6, 11])
  np.testing.assert_array_equal(pieces.piece_ids(1), [7, 8, 10, 12])
  assert pieces.identical == 0


def test_pieces_from_token_pairs_within_the_language_vocabularies():
  pairs = np.array([[5, 105], [6, 106], [7, 107], [8, 108]])
  pieces = isomorphism.pieces_from_token_pairs(pairs, src_ids=np.array([5, 6, 8]), tgt_ids=np.array([105, 107]))
  assert pieces.given == 4 and pieces.pairs == 1
  assert pieces.skipped == {"source_not_in_language_vocab": 1, "target_not_in_language_vocab": 2}
  np.testing.assert_array_equal(pieces.src, [[5]])
  np.testing.assert_array_equal(pieces.tgt, [[105]])
  everything = isomorphism.pieces_from_token_pairs(np.array([[3, 3], [4, 9]]))
  assert everything.pairs == 2 and everything.identical == 1


def test_word_vectors_average_pieces_by_hand():
  table = np.arange(12, dtype=np.float32).reshape(6, 2)  # row r = (2r, 2r + 1)
  pieces = np.array([[1, 3, -1], [5, -1, -1], [-1, -1, -1], [0, 2, 4]])
  vectors, valid = isomorphism.word_vectors(table, pieces)
  np.testing.assert_allclose(vectors, [[4, 5], [10, 11], [0, 0], [4, 5]])
  np.testing.assert_array_equal(valid, [True, True, False, True])
  vectors, valid = isomorphism.word_vectors(table, pieces, row_valid=np.array([1, 1, 1, 1, 0, 1], bool))
  np.testing.assert_array_equal(valid, [True, True, False, False])  # Row 4 is missing: the last word is out.
  np.testing.assert_allclose(vectors[3], [0, 0])


# ------------------------------------------------------------ pair cosine


def _pair_cosine_reference(x, y, src_word, tgt_word, mask):
  """Loops over every (i, j) straight from the definition."""
  keep = [i for i in range(len(x)) if mask[i]]
  gold = [_cos(x[i], y[i]) for i in keep]
  shuffled = [_cos(x[i], y[j]) for i in keep for j in keep
              if i != j and src_word[i] != src_word[j] and tgt_word[i] != tgt_word[j]]
  return np.mean(gold), np.mean(shuffled), len(gold), len(shuffled)


def test_pair_cosine_matches_a_double_loop():
  rng = np.random.default_rng(3)
  p = 23
  x, y = rng.normal(size=(p, 7)) + 0.5, rng.normal(size=(p, 7)) + 0.5
  src_word = rng.integers(0, 9, size=p)  # Repeated words, as with several translations per source.
  tgt_word = rng.integers(0, 12, size=p)
  mask = rng.random(p) > 0.2
  got = isomorphism.pair_cosine(x, y, src_word=src_word, tgt_word=tgt_word, mask=mask)
  want = _pair_cosine_reference(x, y, src_word, tgt_word, mask)
  np.testing.assert_allclose(got[:2], want[:2], rtol=1e-10)
  assert got[2:] == want[2:]
  plain = isomorphism.pair_cosine(x, y)
  want = _pair_cosine_reference(x, y, np.arange(p), np.arange(p), np.ones(p, bool))
  np.testing.assert_allclose(plain[:2], want[:2], rtol=1e-10)
  assert plain.shuffled_pairs == p * (p - 1)


def test_pair_cosine_by_hand_and_empty():
  # Pairs: (e0, e0) cos 1, (e1, e0 + e1) cos 1/sqrt2. Shuffled: (e0, e0 + e1) 1/sqrt2, (e1, e0) 0.
  x = np.array([[1.0, 0.0], [0.0, 1.0]])
  y = np.array([[1.0, 0.0], [1.0, 1.0]])
  got = isomorphism.pair_cosine(x, y)
  assert got.mean == pytest.approx((1 + 0.5 ** 0.5) / 2) and got.shuffled_mean == pytest.approx(0.5 ** 0.5 / 2)
  # Same source word for both pairs: no shuffled pair is left.
  same = isomorphism.pair_cosine(x, y, src_word=np.array([0, 0]))
  assert np.isnan(same.shuffled_mean) and same.shuffled_pairs == 0
  empty = isomorphism.pair_cosine(x, y, mask=np.zeros(2, bool))
  assert np.isnan(empty.mean) and empty.pairs == 0


# ------------------------------------------------------------ analogies


def _shift_toy(p=12, e=9, seed=0):
  """Unit y_i = -d/2 + w_i, x_i = d/2 + w_i with w_i orthogonal to d: the two sides differ by one shift d."""
  rng = np.random.default_rng(seed)
  d = np.zeros(e)
  d[0] = 0.6
  w = rng.normal(size=(p, e))
  w[:, 0] = 0.0
  w *= np.sqrt(1 - 0.09) / np.linalg.norm(w, axis=1, keepdims=True)
  return d / 2 + w, -d / 2 + w


def test_a_consistent_shift_solves_every_translation_analogy():
  x, y = _shift_toy()
  p = len(x)
  words = np.arange(p)
  cos = isomorphism.pair_cosine(x, y)
  assert cos.mean == pytest.approx(1 - 0.36 / 2)  # x_i . y_i = |w|^2 - |d|^2 / 4 = 1 - |d|^2 / 2.
  quads = isomorphism.sample_quadruples(words, words, count=50, seed=1)
  got = isomorphism.translation_analogies(x, y, src_word=words, tgt_word=words, quadruples=quads)
  assert got["accuracy"] == got["mono_accuracy"] == 1.0
  assert got["mean_cosine"] == pytest.approx(1.0) and got["mono_mean_cosine"] == pytest.approx(1.0)
  assert got["quadruples"] == 50 and got["source_candidates"] == got["target_candidates"] == p


def _three_cos_add_reference(a, b, c, candidates, answer, excluded):
  """One analogy by a loop over candidates."""
  unit = [v / np.linalg.norm(v) for v in (a, b, c)]
  pred = unit[1] - unit[0] + unit[2]
  best, best_score = -1, -np.inf
  for k, cand in enumerate(candidates):
    if k in excluded:
      continue
    score = _cos(pred, cand)
    if score > best_score:
      best, best_score = k, score
  return best, _cos(pred, candidates[answer])


def test_translation_analogies_match_a_loop_with_repeated_words():
  rng = np.random.default_rng(7)
  # 16 pairs over 10 source and 12 target words (a word's rows are equal, as word_vectors makes them).
  src_word = np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5])
  tgt_word = np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 0, 4, 3, 2])
  src_vec, tgt_vec = rng.normal(size=(10, 5)), rng.normal(size=(12, 5))
  tgt_vec[:10] = 0.7 * src_vec + 0.5 * rng.normal(size=(10, 5)) + 0.4  # Partly isomorphic.
  x, y = src_vec[src_word], tgt_vec[tgt_word]
  quads = isomorphism.sample_quadruples(src_word, tgt_word, count=100, seed=2)
  got = isomorphism.translation_analogies(x, y, src_word=src_word, tgt_word=tgt_word, quadruples=quads)
  hits, cosines, mono_hits, mono_cosines, nn_hits = [], [], [], [], []
  for ia, ib in quads:
    sa, sb, ta, tb = src_word[ia], src_word[ib], tgt_word[ia], tgt_word[ib]
    best, cos = _three_cos_add_reference(tgt_vec[ta], src_vec[sa], tgt_vec[tb], src_vec, sb, {sa})
    hits.append(best == sb)
    cosines.append(cos)
    best, cos = _three_cos_add_reference(src_vec[sa], src_vec[sb], tgt_vec[ta], tgt_vec, tb, {ta})
    mono_hits.append(best == tb)
    mono_cosines.append(cos)
    scores = [-np.inf if k == sa else _cos(tgt_vec[tb], cand) for k, cand in enumerate(src_vec)]
    nn_hits.append(int(np.argmax(scores)) == sb)
  assert got["quadruples"] == len(quads) > 50
  assert got["accuracy"] == pytest.approx(np.mean(hits)) and got["mono_accuracy"] == pytest.approx(np.mean(mono_hits))
  assert got["nn_accuracy"] == pytest.approx(np.mean(nn_hits))
  assert got["mean_cosine"] == pytest.approx(np.mean(cosines))
  assert got["mono_mean_cosine"] == pytest.approx(np.mean(mono_cosines))
  assert 0 < np.mean(hits) < 1  # The toy is neither trivial nor hopeless.


def test_nearest_candidate_excludes_the_query_words():
  candidates = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0]])
  queries = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
  got = isomorphism.nearest_candidate(queries, candidates, answers=np.array([1, 1, 2]),
                                      exclude=np.array([[-1, -1], [0, -1], [0, 2]]))
  # Query 0: row 0 wins (a miss). Query 1: row 0 excluded, row 1 next. Query 2: its answer is excluded.
  np.testing.assert_array_equal(got.predicted, [0, 1, 1])
  assert got.accuracy == pytest.approx(1 / 3)
  everything = isomorphism.nearest_candidate(queries[:1], candidates[:1], answers=np.array([0]),
                                             exclude=np.array([[0]]))
  assert everything.predicted.tolist() == [-1] and everything.accuracy == 0.0


def test_sample_quadruples_is_deterministic_and_admissible():
  src_word = np.array([0, 0, 1, 2, 3, 4, 5])
  tgt_word = np.array([0, 1, 1, 2, 3, 4, 4])
  mask = np.array([1, 1, 1, 1, 1, 1, 0], bool)
  admissible = {(a, b) for a, b in itertools.permutations(range(6), 2)
                if src_word[a] != src_word[b] and tgt_word[a] != tgt_word[b]}
  everything = isomorphism.sample_quadruples(src_word, tgt_word, count=1000, seed=0, mask=mask)
  assert {tuple(q) for q in everything.tolist()} == admissible and len(everything) == len(admissible)
  some = isomorphism.sample_quadruples(src_word, tgt_word, count=5, seed=4, mask=mask)
  assert len(some) == 5 and len({tuple(q) for q in some.tolist()}) == 5
  np.testing.assert_array_equal(some, isomorphism.sample_quadruples(src_word, tgt_word, count=5, seed=4, mask=mask))
  assert not np.array_equal(some, isomorphism.sample_quadruples(src_word, tgt_word, count=5, seed=5, mask=mask))
  assert isomorphism.sample_quadruples(np.array([0]), np.array([0]), count=5).shape == (0, 2)
  # Large sets take the sampled path: still admissible and distinct.
  n = 1500
  big = isomorphism.sample_quadruples(np.arange(n), np.arange(n) // 2, count=300, seed=0)
  assert len(big) == 300 and len({tuple(q) for q in big.tolist()}) == 300
  assert (big[:, 0] // 2 != big[:, 1] // 2).all()
