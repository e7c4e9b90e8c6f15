"""Tests for flax_xalign.data.transforms.synthetic: derived languages."""

import numpy as np
import pytest

from flax_xalign import errors
from flax_xalign.data.vocab import specials
from flax_xalign.data.transforms import syntax
from flax_xalign.data.transforms import synthetic
V = 61  # Odd, so an offset by a wrong size shows.
SOV_AN = syntax.ReorderSpec.from_string("SOV,AN")

# "ὁ ἀγαθὸς ἄνθρωπος βλέπει τὸν λόγον" -- the good man sees the word (SVO).
GREEK = ["ὁ", "ἀγαθὸς", "ἄνθρωπος", "βλέπει", "τὸν", "λόγον"]
GREEK_POS = ["DET", "ADJ", "NOUN", "VERB", "DET", "NOUN"]
GREEK_NER = ["O", "O", "O", "O", "O", "O"]
GREEK_HEADS = [(3, "det"), (3, "amod"), (4, "nsubj"), (0, "root"),
               (6, "det"), (4, "obj")]


def greek_parse():
  return syntax.Sentence(tuple(
      syntax.Token(i, w, p, h, r) for i, (w, p, (h, r)) in enumerate(
          zip(GREEK, GREEK_POS, GREEK_HEADS), start=1)))


def test_parse_transforms():
  for spec in ("trans_inv", "trans,inv", "Trans + inv", " trans inv "):
    assert synthetic.parse_transforms(spec) == ("trans", "inv")
  assert synthetic.parse_transforms("inv") == ("inv",)
  with pytest.raises(errors.UserError, match="trans, inv, syn"):
    synthetic.parse_transforms("trans_perm")
  with pytest.raises(errors.UserError, match="repeats"):
    synthetic.parse_transforms("inv_inv")
  with pytest.raises(errors.UserError, match="No transform"):
    synthetic.parse_transforms(" ,")


def test_language_properties_and_validation():
  lang = synthetic.SyntheticLanguage("trans_syn", V, syntax=SOV_AN)
  assert lang.transforms == ("trans", "syn")
  assert lang.name == "trans_syn"
  assert lang.transliterates and lang.derived_vocab_size == 2 * V
  inv = synthetic.SyntheticLanguage(("inv",), V)
  assert not inv.transliterates and inv.derived_vocab_size == V
  np.testing.assert_array_equal(inv.id_map(), np.arange(V))
  with pytest.raises(errors.UserError, match="syntax="):
    synthetic.SyntheticLanguage(("trans", "syn"), V)
  with pytest.raises(errors.UserError, match="syntax="):
    synthetic.SyntheticLanguage(("inv",), V, syntax=SOV_AN)
  with pytest.raises(errors.UserError, match="overlap"):
    synthetic.SyntheticLanguage(("inv",), V, overlap=0.5)
  with pytest.raises(errors.UserError, match="outside"):
    synthetic.SyntheticLanguage(("trans",), V, overlap=1.5)
  with pytest.raises(errors.UserError, match="vocab_size"):
    synthetic.SyntheticLanguage(("trans",), 5)


def test_transliteration_offsets_every_regular_id():
  lang = synthetic.SyntheticLanguage(("trans",), V)
  mapping = lang.id_map()
  assert mapping.dtype == np.int32 and mapping.shape == (V,)
  np.testing.assert_array_equal(mapping[:5], np.arange(5))
  np.testing.assert_array_equal(mapping[5:], np.arange(5, V) + V)
  assert lang.shared_ids().size == 0
  ids = np.array([[3, 5, 60], [0, 1, 7]])
  np.testing.assert_array_equal(lang.transliterate_ids(ids),
                                [[3, 5 + V, 60 + V], [0, 1, 7 + V]])
  assert lang.transliterate_ids([]).shape == (0,)
  for bad in ([V], [-1], [[1, 2 * V]], [1.0]):
    with pytest.raises(ValueError):
      lang.transliterate_ids(bad)


def test_overlap_is_exact_and_seeded():
  lang = synthetic.SyntheticLanguage(("trans",), V, overlap=0.25, seed=3)
  shared = lang.shared_ids()
  assert shared.size == round(0.25 * (V - 5)) == 14
  assert np.all(np.diff(shared) > 0) and shared.min() >= 5
  mapping = lang.id_map()
  moved = np.setdiff1d(np.arange(5, V), shared)
  np.testing.assert_array_equal(mapping[shared], shared)
  np.testing.assert_array_equal(mapping[moved], moved + V)
  np.testing.assert_array_equal(mapping[:5], np.arange(5))
  again = synthetic.SyntheticLanguage(("trans",), V, overlap=0.25, seed=3)
  np.testing.assert_array_equal(again.shared_ids(), shared)
  other = synthetic.SyntheticLanguage(("trans",), V, overlap=0.25, seed=4)
  assert not np.array_equal(other.shared_ids(), shared)
  # The returned arrays are copies: mutating one leaves the language intact.
  mapping[:] = 0
  np.testing.assert_array_equal(lang.id_map()[:5], np.arange(5))
  full = synthetic.SyntheticLanguage(("trans",), V, overlap=1.0)
  np.testing.assert_array_equal(full.id_map(), np.arange(V))


def test_inversion_moves_words_and_labels_and_is_an_involution():
  lang = synthetic.SyntheticLanguage(("inv",), V)
  labels = {"pos": GREEK_POS, "ner": ["B-PER", "I-PER", "O", "O", "B-LOC",
                                      "O"]}
  words, moved = lang.transform_words(GREEK, labels)
  assert words == GREEK[::-1]
  assert moved["pos"] == GREEK_POS[::-1]
  assert moved["ner"] == ["O", "B-LOC", "O", "O", "B-PER", "I-PER"]
  assert lang.permutation(4) == [3, 2, 1, 0]
  back, restored = lang.transform_words(words, moved)
  assert back == GREEK and restored == labels
  assert lang.transform_words([], {"pos": []}) == ([], {"pos": []})


@pytest.mark.parametrize("tags, perm, expected", [
    (["B-PER", "I-PER", "O"], [2, 1, 0], ["O", "B-PER", "I-PER"]),
    (["B-PER", "B-PER"], [1, 0], ["B-PER", "B-PER"]),
    (["B-PER", "I-PER", "I-PER"], [2, 0, 1], ["B-PER", "I-PER", "I-PER"]),
    (["B-PER", "I-PER", "O"], [0, 2, 1], ["B-PER", "O", "B-PER"]),
    # IOB1 input: spans may open with I-; the output is IOB2.
    (["I-LOC", "I-LOC", "O", "I-ORG"], [3, 2, 1, 0],
     ["B-ORG", "O", "B-LOC", "I-LOC"]),
    (["B-LOC", "I-ORG"], [1, 0], ["B-ORG", "B-LOC"]),
])
def test_repair_bio(tags, perm, expected):
  assert synthetic.repair_bio(tags, perm) == expected


def test_bio_keys_select_which_labels_are_repaired():
  lang = synthetic.SyntheticLanguage(("inv",), V)
  tags = ["B-PER", "I-PER"]
  _, moved = lang.transform_words(["a", "b"], {"ner": tags, "tag": tags})
  assert moved == {"ner": ["B-PER", "I-PER"], "tag": ["I-PER", "B-PER"]}
  _, moved = lang.transform_words(["a", "b"], {"tag": tags},
                                  bio_keys=("tag",))
  assert moved == {"tag": ["B-PER", "I-PER"]}
  with pytest.raises(ValueError, match="not BIO"):
    lang.transform_words(["a"], {"ner": ["S-PER"]})
  with pytest.raises(ValueError, match="2 entries for 3 words"):
    lang.transform_words(["a", "b", "c"], {"pos": ["X", "Y"]})


def test_trans_inv_reverses_words_and_offsets_ids():
  lang = synthetic.SyntheticLanguage(("trans", "inv"), V)
  vocab = {w: i for i, w in enumerate(GREEK, start=10)}
  words, moved = lang.transform_words(GREEK, {"pos": GREEK_POS})
  assert words == GREEK[::-1] and moved["pos"] == GREEK_POS[::-1]
  ids = lang.transliterate_ids([3] + [vocab[w] for w in words] + [1])
  assert ids.tolist() == [3, 15 + V, 14 + V, 13 + V, 12 + V, 11 + V,
                          10 + V, 1]


def test_syntax_moves_words_with_their_labels():
  lang = synthetic.SyntheticLanguage(("trans", "syn"), V, syntax=SOV_AN)
  words, moved = lang.transform_words(
      GREEK, {"pos": GREEK_POS, "ner": GREEK_NER}, parse=greek_parse(),
      sentence_seed=40001001)
  assert words == ["ὁ", "ἀγαθὸς", "ἄνθρωπος", "τὸν", "λόγον", "βλέπει"]
  assert moved["pos"] == ["DET", "ADJ", "NOUN", "DET", "NOUN", "VERB"]
  assert moved["ner"] == GREEK_NER
  na = synthetic.SyntheticLanguage(
      ("syn",), V, syntax=syntax.ReorderSpec.from_string("VSO,NA"))
  words, _ = na.transform_words(GREEK, parse=greek_parse())
  assert words == ["βλέπει", "ὁ", "ἄνθρωπος", "ἀγαθὸς", "τὸν", "λόγον"]
  with pytest.raises(errors.UserError, match="pass parse="):
    lang.transform_words(GREEK)
  with pytest.raises(errors.UserError, match="sentence has 5"):
    lang.transform_words(GREEK[:5], parse=greek_parse())


def test_stochastic_syntax_is_seeded_per_sentence():
  spec = syntax.ReorderSpec.from_string("VSO,NA@0.5")

  def orders(seed):
    lang = synthetic.SyntheticLanguage(("syn",), V, seed=seed, syntax=spec)
    return [tuple(lang.permutation(6, parse=greek_parse(), sentence_seed=s))
            for s in range(16)]
  assert orders(0) == orders(0)
  assert orders(0) != orders(1)
  assert len(set(orders(0))) > 1


def test_compositions_apply_word_transforms_in_order():
  parse, seed = greek_parse(), 5
  syn = synthetic.SyntheticLanguage(("syn",), V, syntax=SOV_AN)
  syn_inv = synthetic.SyntheticLanguage(("syn", "inv"), V, syntax=SOV_AN)
  inv_syn = synthetic.SyntheticLanguage(("inv", "syn"), V, syntax=SOV_AN)
  order = syn.permutation(6, parse=parse, sentence_seed=seed)
  assert syn_inv.permutation(6, parse=parse, sentence_seed=seed) == (
      order[::-1])
  # Inverting first mirrors the tree ("λόγον τὸν βλέπει ἄνθρωπος ἀγαθὸς
  # ὁ"); SOV,AN then moves the subject and the adjective left of their heads
  # and leaves the determiners where inversion put them.
  words, _ = inv_syn.transform_words(GREEK, parse=parse, sentence_seed=seed)
  assert words == ["λόγον", "τὸν", "ἀγαθὸς", "ἄνθρωπος", "ὁ", "βλέπει"]


def test_project_id_maps_are_unchanged():
  """Recorded from the code before `specials` existed (fixed ids 0..4)."""
  import hashlib

  lang = synthetic.SyntheticLanguage(("trans",), V, overlap=0.25, seed=3)
  assert lang.specials == specials.PROJECT
  assert lang.shared_ids().tolist() == [7, 8, 9, 13, 15, 22, 28, 31, 34, 39,
                                        43, 47, 51, 59]
  np.testing.assert_array_equal(lang.regular_ids(), np.arange(5, V))
  big = synthetic.SyntheticLanguage(("trans", "inv"), 8003, overlap=0.1,
                                    seed=3)
  assert hashlib.sha256(big.id_map().tobytes()).hexdigest() == (
      "7573272c2ae0966d6761a8293e3cb47393b2d227add9048f38aa138f5dadbf1b")


XLMR = specials.SpecialTokens(bos=0, pad=1, eos=2, unk=3, mask=V - 1,
                              first_regular=4, end_regular=V - 1)


def test_xlmr_layout_keeps_its_specials():
  lang = synthetic.SyntheticLanguage(("trans",), V, specials=XLMR)
  mapping = lang.id_map()
  np.testing.assert_array_equal(lang.regular_ids(), np.arange(4, V - 1))
  np.testing.assert_array_equal(mapping[:4], np.arange(4))  # <s> <pad> </s> <unk>
  assert mapping[V - 1] == V - 1  # <mask>, last.
  np.testing.assert_array_equal(mapping[4:V - 1], np.arange(4, V - 1) + V)
  np.testing.assert_array_equal(lang.transliterate_ids([[0, 4, 2, 1]]),
                                [[0, 4 + V, 2, 1]])
  shared = synthetic.SyntheticLanguage(("trans",), V, overlap=0.5, seed=1,
                                       specials=XLMR).shared_ids()
  assert shared.size == round(0.5 * (V - 5))
  assert shared.min() >= 4 and shared.max() < V - 1


def test_every_special_id_is_fixed_wherever_it_is():
  # <mask> inside [first_regular, end_regular), ids above end_regular unused.
  odd = specials.SpecialTokens(pad=0, eos=1, unk=2, bos=3, mask=30,
                               first_regular=4, end_regular=50)
  lang = synthetic.SyntheticLanguage(("trans",), V, specials=odd)
  mapping = lang.id_map()
  fixed = [0, 1, 2, 3, 30, *range(50, V)]
  np.testing.assert_array_equal(mapping[fixed], fixed)
  moved = np.setdiff1d(np.arange(V), fixed)
  np.testing.assert_array_equal(mapping[moved], moved + V)
  np.testing.assert_array_equal(lang.regular_ids(), moved)
  with pytest.raises(errors.UserError, match="no regular ids"):
    synthetic.SyntheticLanguage(("trans",), 4, specials=XLMR)
  with pytest.raises(errors.UserError, match="SpecialTokens"):
    synthetic.SyntheticLanguage(("trans",), V, specials={"pad": 0})
