"""BLI: Hit@k and coverage on hand-built toys, and per-layer averaging against a direct computation."""

import jax
import numpy as np
import pytest

from flax_xalign.evaluation.lexicon import bli
from flax_xalign.models.encoder import Encoder
from tests.evaluation.transfer_testlib import random_params
from tests.testlib import tiny_encoder_config


def test_hits_at_k_by_hand():
  top = np.array([[2, 0, 1], [1, 2, 0], [0, 1, 2], [-1, -1, -1]])
  gold = np.array([[0, -1], [2, 1], [2, -1], [1, -1]])
  # Hit@1: only query 1 (its top target 1 is one of its two translations). Hit@2: queries 0 and 1.
  # The last query has no ranked target at all (-1 never matches gold padding).
  assert bli.hits_at_k(top, gold, ks=(1, 2, 3)) == {"hit@1": 0.25, "hit@2": 0.5, "hit@3": 0.75}
  with pytest.raises(ValueError, match="Hit@5"):
    bli.hits_at_k(top, gold, ks=(5,))


def _hub_toy():
  """3 sources e_i; targets t_i (cos 0.5 with s_i, 0 with the others), a hub (cos 0.577 with every source),
  and a masked row equal to s_0 that must never be returned. Plus a masked source row."""
  eye = np.eye(6, dtype=np.float32)
  src = np.stack([eye[0], eye[1], eye[2], eye[3]])
  tgt = np.stack([0.5 * eye[i] + 0.75 ** 0.5 * eye[3 + i] for i in range(3)]
                 + [(eye[0] + eye[1] + eye[2]) / 3 ** 0.5, eye[0]])
  return src, np.array([1, 1, 1, 0], bool), tgt, np.array([1, 1, 1, 1, 0], bool)


def _csls_reference(src, tgt, src_valid, tgt_valid, knn):
  """Brute-force CSLS from Eq. 1-2, in NumPy, over the valid rows (masked targets -inf)."""
  def unit(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)
  cos = unit(src) @ unit(tgt).T
  r_src = np.array([np.sort(row[tgt_valid])[::-1][:knn].mean() for row in cos])
  r_tgt = np.array([np.sort(col[src_valid])[::-1][:knn].mean() for col in cos.T])
  csls = 2 * cos - r_src[:, None] - r_tgt[None, :]
  return np.where(tgt_valid[None, :], csls, -np.inf)


def test_nn_falls_for_the_hub_and_csls_does_not():
  src, src_mask, tgt, tgt_mask = _hub_toy()
  gold = bli.Gold(sources=np.array([0, 1, 2], np.int32), targets=np.array([[0], [1], [2]], np.int32), entries=3,
                  covered=3, out_of_coverage={})
  scores = bli.score(src, tgt, gold, src_mask=src_mask, tgt_mask=tgt_mask, knn=2)
  # By hand: cos(s_i, hub) = 0.577 > cos(s_i, t_i) = 0.5, so NN picks the hub for every source.
  # CSLS with K = 2: r(s_i) = (0.577 + 0.5) / 2, r(t_i) = (0.5 + 0) / 2 = 0.25, r(hub) = 0.577;
  # CSLS(s_i, t_i) = 1 - 0.539 - 0.25 = 0.211 > CSLS(s_i, hub) = 1.155 - 0.539 - 0.577 = 0.039.
  assert scores["nn"] == {"hit@1": 0.0, "hit@5": 1.0}
  assert scores["csls"] == {"hit@1": 1.0, "hit@5": 1.0}
  top = bli.induce(src, tgt, method="csls", k=5, knn=2, src_mask=src_mask, tgt_mask=tgt_mask)
  ref = _csls_reference(src, tgt, src_mask, tgt_mask, knn=2)
  np.testing.assert_allclose(np.asarray(top.values)[:3, 0], ref[[0, 1, 2], [0, 1, 2]], atol=1e-5)
  np.testing.assert_allclose(ref[0, [0, 3]], [1 - (0.5 + 3 ** -0.5) / 2 - 0.25, 2 * 3 ** -0.5 - (0.5 + 3 ** -0.5) / 2
                                               - 3 ** -0.5], atol=1e-6)
  assert not (np.asarray(top.indices) == 4).any()  # The masked target is never returned.
  assert (np.asarray(top.indices)[3] == -1).all()  # The masked source has no neighbours.
  with pytest.raises(Exception, match="unknown BLI method"):
    bli.induce(src, tgt, method="dot")


WORD_IDS = {"λόγος": [10], "θεός": [11], "ἀγάπη": [12, 13], "ὁ": [14], "καί": [15],
            "word": [20], "god": [21], "love": [22], "the": [23], "and": [24, 25], "message": [26]}


def _encode(text):
  return WORD_IDS.get(text, [99, 98])


def test_gold_from_lexicon_counts_every_out_of_coverage_entry():
  lexicon = {"λόγος": ["word", "message"], "Λόγος": ["word"], "θεός": ["god"], "ἀγάπη": ["love"],
             "ὁ": ["the"], "καί": ["and"], "οὐ": ["not"]}
  src_ids, src_mask = np.array([10, 11, 14, 15, 0]), np.array([1, 1, 0, 1, 0], bool)   # 14 (ὁ) is masked
  tgt_ids, tgt_mask = np.array([20, 22, 23, 0]), np.array([1, 1, 1, 0], bool)          # no "god" (21), "message"
  gold = bli.gold_from_lexicon(lexicon, encode=_encode, src_ids=src_ids, src_mask=src_mask, tgt_ids=tgt_ids,
                               tgt_mask=tgt_mask, normalize=str.lower)
  # In coverage: λόγος and Λόγος (lowercased: one query, row 0 -> "word" row 0). Out: θεός (god not language-
  # specific), ἀγάπη (two tokens), ὁ (masked row), καί (and: two tokens), οὐ (unknown: two tokens).
  assert (gold.entries, gold.covered, gold.queries, gold.gold_pairs) == (7, 2, 1, 1)
  assert gold.coverage == pytest.approx(2 / 7)
  np.testing.assert_array_equal(gold.sources, [0])
  np.testing.assert_array_equal(gold.targets, [[0]])
  assert gold.out_of_coverage == {
      bli.SOURCE_NOT_ONE_TOKEN: 2, bli.SOURCE_NOT_LANGUAGE_SPECIFIC: 1, bli.NO_TRANSLATION_COVERED: 2,
      bli.TRANSLATION_NOT_ONE_TOKEN: 1, bli.TRANSLATION_NOT_LANGUAGE_SPECIFIC: 2}
  assert gold.examples[bli.SOURCE_NOT_ONE_TOKEN] == ("ἀγάπη", "οὐ")
  assert gold.examples[bli.TRANSLATION_NOT_LANGUAGE_SPECIFIC] == ("message", "god")
  # Restricting to rows that occur in the text read drops the query whose only target is gone.
  restricted = gold.restricted(np.ones(5, bool), np.array([0, 1, 1, 0], bool))
  assert restricted.queries == 0 and restricted.entries == 7


def test_gold_from_token_pairs_synthetic_map():
  v = 50
  natural = np.arange(5, 12)
  pairs = np.stack([natural, natural + v], axis=1)
  src_ids, src_mask = np.array([5, 6, 7, 8, 9, 0]), np.array([1, 1, 1, 1, 1, 0], bool)
  tgt_ids, tgt_mask = np.arange(55, 61), np.array([1, 1, 0, 1, 1, 1], bool)  # 57 masked; 61 absent
  gold = bli.gold_from_token_pairs(pairs, src_ids=src_ids, src_mask=src_mask, tgt_ids=tgt_ids, tgt_mask=tgt_mask)
  # Sources 5..9 are in; 7's translation 57 is masked; 10, 11 are not source rows.
  assert (gold.entries, gold.covered) == (7, 4)
  np.testing.assert_array_equal(gold.sources, [0, 1, 3, 4])
  np.testing.assert_array_equal(gold.targets[:, 0], [0, 1, 3, 4])
  assert gold.out_of_coverage[bli.SOURCE_NOT_LANGUAGE_SPECIFIC] == 2
  assert gold.out_of_coverage[bli.NO_TRANSLATION_COVERED] == 1


def test_sentence_rows_layout():
  rows = bli.sentence_rows([[7, 8, 9, 10], [11]], bos=0, eos=2, pad=1, lang_id=3, length=5)
  np.testing.assert_array_equal(rows["tokens"], [[0, 7, 8, 9, 2], [0, 11, 2, 1, 1]])
  np.testing.assert_array_equal(rows["segment_ids"], [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
  np.testing.assert_array_equal(rows["positions"], [[0, 1, 2, 3, 4], [0, 1, 2, 0, 0]])
  np.testing.assert_array_equal(rows["lang_ids"], [[3] * 5, [3, 3, 3, 0, 0]])


def test_contextual_means_average_every_occurrence():
  config = tiny_encoder_config(vocab_size=41, dropout_rate=0.0)
  encoder, params = Encoder(config), random_params(config)
  rng = np.random.default_rng(0)
  sentences = [rng.integers(5, 41, size=rng.integers(1, 12)) for _ in range(11)]
  sentences[3] = np.array([6, 6, 6, 9])  # Several occurrences in one sentence.
  rows = bli.sentence_rows(sentences, bos=3, eos=1, pad=0, lang_id=2, length=14)
  vocab = np.array([6, 9, 17, 40, 3])  # 3 is <s>: collected only as the rows hold it (position 0 of every row).
  layers = (1, 2)
  means, counts = bli.contextual_means(encoder, params, rows, vocab_ids=vocab, layers=layers, batch_size=4)
  # Direct: encode each sentence alone, collect the states at the token's positions, average.
  sums = np.zeros((len(layers), len(vocab), config.embed_dim))
  want_counts = np.zeros(len(vocab))
  for r in range(len(sentences)):
    one = {k: v[r:r + 1] for k, v in rows.items()}
    out = encoder.apply({"params": params}, one["tokens"], lang_ids=one["lang_ids"], positions=one["positions"],
                        segment_ids=one["segment_ids"], deterministic=True, return_all_hidden=True)
    for p in range(int(one["segment_ids"].sum())):
      token = one["tokens"][0, p]
      if token in vocab:
        c = int(np.flatnonzero(vocab == token)[0])
        want_counts[c] += 1
        for i, layer in enumerate(layers):
          sums[i, c] += np.asarray(jax.device_get(out.all_hidden[layer]))[0, p]
  np.testing.assert_array_equal(counts, want_counts)
  assert counts[4] == len(sentences)  # <s> of every real row, none of the padding rows of the last batch.
  want = np.where(want_counts[None, :, None] > 0, sums / np.maximum(want_counts, 1)[None, :, None], 0.0)
  np.testing.assert_allclose(means, want, atol=2e-5)
  assert counts[vocab == 40][0] == want_counts[vocab == 40][0]
