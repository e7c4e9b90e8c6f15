"""flax_xalign.data.vocab.normalize: the Python and TensorFlow normalisers agree."""

import unicodedata

import pytest
import tensorflow as tf

from flax_xalign import errors
from flax_xalign.data.vocab import normalize
LATIN = ["Café naïve résumé à la façon d'Ångström", "Ελληνικά: ἄνθρωπος, ᾠδή, Ἰησοῦς",
         "ΟΔΟΣ ΛΟΓΟΣ Σ", "İstanbul Straße ǅemal", "ﬁne ① Ⅻ ｶﾀｶﾅ ＡＢＣ", "한국어 텍스트",
         "e\u0301 o\u0308 n\u0303 (combining)", "plain ascii, already stripped", "", " ", "\u200b"]


@pytest.fixture(scope="module")
def sample(bible_data_dir):
  from flax_xalign.data.sources import bible
  verses = [text for _, text in bible.greek_verses("test", data_dir=bible_data_dir)]
  assert len(verses) > 100
  stripped = [normalize.normalize_text(v, "nfd_strip_marks") for v in verses[:50]]
  return verses[::7] + stripped + LATIN


def _tf(texts, name):
  return [t.decode("utf-8") for t in normalize.normalize_tf(tf.constant(texts), name).numpy()]


@pytest.mark.parametrize("name", normalize.NORMALIZERS)
def test_python_and_tensorflow_agree(sample, name):
  assert _tf(sample, name) == [normalize.normalize_text(t, name) for t in sample]


@pytest.mark.parametrize("name", normalize.NORMALIZERS)
def test_tensorflow_normaliser_runs_in_a_dataset_map(name):
  ds = tf.data.Dataset.from_tensor_slices(LATIN).map(lambda t: normalize.normalize_tf(t, name))
  assert [t.decode("utf-8") for t in ds.as_numpy_iterator()] == [normalize.normalize_text(t, name)
                                                                   for t in LATIN]


def test_what_each_normaliser_does():
  text = "Ἐν ἀρχῇ ἦν ὁ λόγος, Café ﬁ"
  assert normalize.normalize_text(text, "") == text
  stripped = normalize.normalize_text(text, "nfd_strip_marks")
  assert stripped == "Εν αρχη ην ο λογος, Cafe ﬁ"
  assert not any(unicodedata.category(c) == "Mn" for c in unicodedata.normalize("NFD", stripped))
  assert normalize.normalize_text(stripped, "nfd_strip_marks") == stripped  # Idempotent.
  assert normalize.normalize_text("한국어", "nfd_strip_marks") == "한국어"  # Composed again.
  assert normalize.normalize_text("ﬁ ＡＢＣ", "nfkc") == "fi ABC"
  assert normalize.normalize_text("ΟΔΟΣ Café", "lower") == "οδος café"


def test_unknown_normaliser_is_a_user_error():
  with pytest.raises(errors.UserError, match="'nfd' is not a known text normaliser.*nfd_strip_marks"):
    normalize.check_normalizer("nfd")
  with pytest.raises(errors.UserError, match="not a known"):
    normalize.normalize_text("x", "upper")
  with pytest.raises(errors.UserError, match="not a known"):
    normalize.normalize_tf(tf.constant("x"), None)
