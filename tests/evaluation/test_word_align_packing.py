"""The aligner's packed path: segments several to a row, the encoder stopped at the deepest layer asked.

Its links must be the links of the reference path (one pair per row, padded, every layer computed) for
every method, layer, encoding and layout, on pairs of many lengths spread over several windows.
"""

import random

import numpy as np
import pytest

from flax_xalign.evaluation.word_alignment import packing, word_align
from flax_xalign.ops import AlignmentSolver
from tests.evaluation.test_word_align import CONFIG, DE, EN, init_model


@pytest.fixture(scope="module")
def vocabulary(tiny_corpus):
  from flax_xalign.data.vocab import sentencepiece as vocab
  return vocab.load_vocabulary(tiny_corpus["vocab"])


def random_pairs(count, seed=0):
  rng = random.Random(seed)
  pairs = [(rng.choices(DE, k=rng.randint(1, 14)), rng.choices(EN, k=rng.randint(1, 14))) for _ in range(count)]
  return pairs + [([], EN[:3]), (DE[:2], [])]  # an empty side aligns to nothing on both paths


def test_best_fit_decreasing_fills_rows_and_leaves_what_does_not_fit():
  rows, left = packing.best_fit_decreasing([5, 3, 8, 2, 7, 1], row_length=8, max_rows=3)
  placed = sorted(i for row in rows for i in row)
  assert sorted(placed + left) == list(range(6)) and len(rows) == 3
  assert all(sum([5, 3, 8, 2, 7, 1][i] for i in row) <= 8 for row in rows)
  assert left == [3]  # 8 | 7 1 | 5 3 (best fit: the fullest row that holds it); the 2 waits for a later window
  with pytest.raises(ValueError, match="does not fit"):
    packing.best_fit_decreasing([9], row_length=8, max_rows=1)


def test_pack_windows_places_every_segment_once_in_rows_of_the_given_length():
  rng = random.Random(1)
  lengths = [rng.randint(2, 13) for _ in range(101)]
  order = list(range(101))  # lengths in no order: short ones fill what long ones leave
  batches = list(packing.pack_windows(lengths, order, row_length=13, rows=4))
  seen = [i for batch in batches for row in batch for i in row]
  assert sorted(seen) == list(range(101))
  assert all(len(batch) <= 4 and all(sum(lengths[i] for i in row) <= 13 for row in batch) for batch in batches)
  full = sum(lengths) / (len(batches) * 4 * 13)
  assert full > 0.85, full  # little padding, even with items as long as a row


def test_row_batch_gives_each_segment_its_own_segment_id():
  segments = [packing.Segment(np.arange(3, dtype=np.int32) + 10 * k, np.full(3, k, np.int32),
                              np.arange(3, dtype=np.int32)) for k in range(3)]
  batch = packing.row_batch(segments, [[0, 2], [1]], rows=3, length=7)
  assert batch.offsets == {0: (0, 0), 2: (0, 3), 1: (1, 0)}
  np.testing.assert_array_equal(batch.features["segment_ids"],
                                [[1, 1, 1, 2, 2, 2, 0], [1, 1, 1, 0, 0, 0, 0], [0] * 7])
  np.testing.assert_array_equal(batch.features["tokens"][0, :6], [0, 1, 2, 20, 21, 22])
  np.testing.assert_array_equal(batch.features["positions"][0, :6], [0, 1, 2, 0, 1, 2])


@pytest.mark.filterwarnings("ignore:.*exceed the budget")
@pytest.mark.parametrize("encoding, layout, similarity", [
    ("separate", "restart", "cosine"), ("joint", "restart", "dot"), ("joint", "continuous", "dot")])
def test_packed_links_equal_the_one_pair_per_row_links(vocabulary, encoding, layout, similarity):
  model, params = init_model(seed=4)
  kwargs = dict(languages=["de", "en"], src_lang="de", tgt_lang="en", encoding=encoding, pair_layout=layout,
                options=AlignmentSolver(similarity=similarity), max_length=32)
  pairs = random_pairs(23)
  layers = (0, 2, CONFIG.num_layers)
  # batch_size 3: many windows, carried-over segments and link groups; rows of 32 hold 2-5 segments.
  packed = word_align.WordAligner(model, params, vocabulary, batch_size=3, **kwargs)
  reference = word_align.WordAligner(model, params, vocabulary, batch_size=4, packed=False, **kwargs)
  got = packed.run(pairs, layers=layers, methods=word_align.METHODS)
  want = reference.run(pairs, layers=layers, methods=word_align.METHODS)
  assert packed.last_run["encoder_shapes"] == 1 and packed.last_run["encoder_batches"] > 3
  assert got == want
  assert all(got[("argmax", 2)][:-2]) and got[("argmax", 2)][-2:] == [frozenset(), frozenset()]
  # Only the layers asked are computed: one layer below the top gives the same links alone.
  assert packed.align(pairs, layer=2, method="itermax") == want[("itermax", 2)]


def test_layer_states_stop_at_the_deepest_layer_with_the_full_pass_values(vocabulary):
  model, params = init_model(seed=5)
  aligner = word_align.WordAligner(model, params, vocabulary, languages=["de", "en"], src_lang="de",
                                   tgt_lang="en", batch_size=2)
  features = aligner._batch(aligner.encode([(DE[:5], EN[:6]), (DE[3:6], EN[2:4])]), 2, 32)
  states = word_align._jitted_states(aligner.encoder, (1, 2))(params, features)
  full = aligner.encoder.apply({"params": params}, features["tokens"], lang_ids=features["lang_ids"],
                               positions=features["positions"], segment_ids=features["segment_ids"],
                               deterministic=True, return_all_hidden=True).all_hidden
  np.testing.assert_allclose(states, np.stack([full[1], full[2]]), rtol=1e-5, atol=1e-5)
