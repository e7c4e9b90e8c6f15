"""Word-level featurisation: `<s> pieces </s>` rows, first-subword labels, special ids."""

import numpy as np
import pytest

from flax_xalign.data.vocab.specials import PROJECT, SpecialTokens
from flax_xalign.errors import UserError
from flax_xalign.evaluation.transfer import featurize
from flax_xalign.evaluation.transfer.transfer_data import LabelledSentence, TaggedSentence
from tests.evaluation.transfer_testlib import WordVocabulary, vocabulary_pieces

# An XLM-R-like layout: every special id differs from the project's, and the
# regular ids end below <mask>.
XLMR_LIKE = SpecialTokens(bos=0, pad=1, eos=2, unk=3, mask=9, first_regular=4, end_regular=9)


def test_labels_on_first_subwords_and_truncation_keeps_whole_words():
  vocabulary = WordVocabulary({"ab": [10, 11], "c": [12], "def": [13, 14, 15], "": []})
  featurizer = featurize.Featurizer(vocabulary, max_length=7, specials=PROJECT)
  encoded = featurizer.encode(["ab", "c", "def"])
  # 2 + 1 subwords fit in 7 - 2; "def" (3 more) does not and is dropped whole.
  np.testing.assert_array_equal(encoded.tokens, [3, 10, 11, 12, 1])
  np.testing.assert_array_equal(encoded.word_index, [-1, 0, -1, 1, -1])
  assert encoded.num_words == 2
  features = featurizer.featurize([TaggedSentence(("ab", "c", "def"), ("n", "v", "n")),
                                   TaggedSentence(("", "c"), ("v", "n"))],
                                  label_index={"n": 0, "v": 1})
  assert features.tokens.shape == (2, 7) and features.words_dropped == 1
  np.testing.assert_array_equal(features.weights[0], [0, 1, 0, 1, 0, 0, 0])
  np.testing.assert_array_equal(features.labels[0], [0, 0, 0, 1, 0, 0, 0])
  # A word without pieces becomes <unk> and keeps its label.
  np.testing.assert_array_equal(features.tokens[1], [3, 2, 12, 1, 0, 0, 0])
  np.testing.assert_array_equal(features.labels[1][:3], [0, 1, 0])
  sentences = featurizer.featurize([LabelledSentence(("c",), "k")], label_index={"k": 0})
  assert sentences.labels.shape == (1,) and sentences.weights.tolist() == [1.0]


def test_transliterate_maps_only_regular_ids():
  vocabulary = WordVocabulary({"x": [7, 4], "y": [2], "z": [5, 9]})
  encoded = featurize.encode_words(vocabulary_pieces(vocabulary, "xyz"), max_length=10,
                                   specials=PROJECT, transliterate=lambda ids: ids + 100)
  np.testing.assert_array_equal(encoded.tokens, [3, 107, 4, 2, 105, 109, 1])


def test_special_ids_come_from_the_specials():
  vocabulary = WordVocabulary({"x": [7, 4], "y": [], "z": [5, 9], "w": [6, 2]})
  encoded = featurize.encode_words(vocabulary_pieces(vocabulary, "xyzw"), max_length=12,
                                   specials=XLMR_LIKE, transliterate=lambda ids: ids + 100)
  # <s>=0, <unk>=3 for the empty word, </s>=2; 4 is regular here, 9 (<mask>) and 2 are not.
  np.testing.assert_array_equal(encoded.tokens, [0, 107, 104, 3, 105, 9, 106, 2, 2])
  np.testing.assert_array_equal(encoded.word_index, [-1, 0, -1, 1, 2, -1, 3, -1, -1])
  featurizer = featurize.Featurizer(vocabulary, max_length=16, specials=XLMR_LIKE)
  features = featurizer.featurize([TaggedSentence(("x", "z"), ("a", "b")),
                                   TaggedSentence(("w",), ("b",))], label_index={"a": 0, "b": 1})
  assert features.tokens.shape == (2, 16)
  np.testing.assert_array_equal(features.tokens[0, :7], [0, 7, 4, 5, 9, 2, 1])
  np.testing.assert_array_equal(features.tokens[1, :5], [0, 6, 2, 2, 1])
  # Padding is the vocabulary's pad id (1), not 0.
  assert (features.tokens[0, 6:] == 1).all() and (features.tokens[1, 4:] == 1).all()
  np.testing.assert_array_equal(features.labels[1, :4], [0, 1, 0, 0])


def test_featurizer_reads_special_ids_from_the_sentencepiece_model(spm_vocabulary):
  featurizer = featurize.Featurizer(spm_vocabulary, max_length=24)
  assert featurizer.specials == SpecialTokens(pad=0, eos=1, unk=2, bos=3, mask=4,
                                              first_regular=5)
  encoded = featurizer.encode(["the", "house"])
  assert encoded.tokens[0] == 3 and encoded.tokens[-1] == 1
  assert (encoded.tokens[1:-1] >= 5).all() and encoded.num_words == 2
  with pytest.raises(UserError, match="specials="):
    featurize.Featurizer(WordVocabulary({}))


def test_task_and_label_set():
  tagged = [TaggedSentence(("a", "b"), ("y", "x"))]
  labelled = [LabelledSentence(("a",), "k")]
  assert featurize.task_of(tagged) == "tagging"
  assert featurize.task_of(labelled) == "classification"
  with pytest.raises(UserError, match="all TaggedSentences or all LabelledSentences"):
    featurize.task_of(tagged + labelled)
  with pytest.raises(UserError, match="no examples"):
    featurize.task_of([])
  assert featurize.label_set_of(tagged, labelled) == ("k", "x", "y")
  assert featurize.label_index_of(("k", "x")) == {"k": 0, "x": 1}
  with pytest.raises(UserError, match="not in the label set"):
    featurize.Featurizer(WordVocabulary({"a": [5]}), specials=PROJECT).featurize(
        [LabelledSentence(("a",), "z")], label_index={"k": 0})
