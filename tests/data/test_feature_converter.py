"""Tests for XAlignFeatureConverter on hand-made examples."""

import itertools

import numpy as np
import pytest
import seqio
import tensorflow as tf

from flax_xalign import errors
from flax_xalign.data import feature_converter as fc
from flax_xalign.data.vocab import specials
S, E = 3, 1  # <s>, </s>


def _dataset(examples):
  columns = {
      "tokens": tf.ragged.constant([e[0] for e in examples], tf.int32,
                                   row_splits_dtype=tf.int64),
      "tokens_b": tf.ragged.constant([e[1] for e in examples], tf.int32,
                                     ragged_rank=1, row_splits_dtype=tf.int64),
      "lang": tf.constant([e[2] for e in examples]),
      "lang_b": tf.constant([e[3] for e in examples]),
  }
  ds = tf.data.Dataset.from_tensor_slices(columns)
  return ds.map(lambda ex: {k: v if k.startswith("lang") else
                            tf.cast(v, tf.int32) for k, v in ex.items()})


def _convert(examples, length, pack=True, languages=("en", "grc"), **options):
  converter = fc.XAlignFeatureConverter(list(languages), pack=pack, **options)
  ds = converter(_dataset(examples), task_feature_lengths={"tokens": length})
  return list(ds.as_numpy_iterator())


MONO = ([10, 11, 12], [], "en", "")
PAIR = ([20, 21], [30, 31, 32], "grc", "en")


def test_monolingual_and_pair_layout_unpacked():
  rows = _convert([MONO, PAIR], 13, pack=False)
  assert len(rows) == 2
  mono, pair = rows
  np.testing.assert_array_equal(mono["tokens"], [S, 10, 11, 12, E] + [0] * 8)
  np.testing.assert_array_equal(mono["positions"], [0, 1, 2, 3, 4] + [0] * 8)
  np.testing.assert_array_equal(mono["lang_ids"], [1] * 5 + [0] * 8)
  np.testing.assert_array_equal(mono["pair_side"], [0] * 13)
  np.testing.assert_array_equal(mono["segment_ids"], [1] * 5 + [0] * 8)
  np.testing.assert_array_equal(
      pair["tokens"], [S, 20, 21, E, S, 30, 31, 32, E] + [0] * 4)
  np.testing.assert_array_equal(
      pair["positions"], [0, 1, 2, 3, 0, 1, 2, 3, 4] + [0] * 4)
  np.testing.assert_array_equal(pair["pair_side"], [1] * 4 + [2] * 5 + [0] * 4)
  np.testing.assert_array_equal(pair["lang_ids"], [2] * 4 + [1] * 5 + [0] * 4)
  for row in rows:
    assert set(row) == set(fc.MODEL_FEATURE_KEYS)
    assert all(v.dtype == np.int32 and v.shape == (13,) for v in row.values())


def test_packing_keeps_positions_and_segments():
  rows = _convert([MONO, PAIR, ([40], [], "grc", "")], 15)
  assert len(rows) == 2  # The third example does not fit: greedy, next row.
  np.testing.assert_array_equal(rows[1]["tokens"], [S, 40, E] + [0] * 12)
  np.testing.assert_array_equal(rows[1]["segment_ids"], [1] * 3 + [0] * 12)
  np.testing.assert_array_equal(rows[1]["lang_ids"], [2] * 3 + [0] * 12)
  row = rows[0]
  np.testing.assert_array_equal(
      row["tokens"], [S, 10, 11, 12, E, S, 20, 21, E, S, 30, 31, 32, E, 0])
  np.testing.assert_array_equal(
      row["segment_ids"], [1] * 5 + [2] * 9 + [0])
  np.testing.assert_array_equal(
      row["positions"], [0, 1, 2, 3, 4, 0, 1, 2, 3, 0, 1, 2, 3, 4, 0])
  np.testing.assert_array_equal(row["pair_side"], [0] * 5 + [1] * 4 + [2] * 5
                                + [0])
  np.testing.assert_array_equal(row["lang_ids"], [1] * 5 + [2] * 4 + [1] * 5
                                + [0])
  rows = _convert([MONO, PAIR, ([40], [], "grc", "")], 18)
  np.testing.assert_array_equal(rows[0]["segment_ids"],
                                [1] * 5 + [2] * 9 + [3] * 3 + [0])
  np.testing.assert_array_equal(rows[0]["positions"][14:], [0, 1, 2, 0])


def test_trimming_fits_the_row():
  long_mono = (list(range(10, 40)), [], "en", "")
  row = _convert([long_mono], 9, pack=False)[0]
  np.testing.assert_array_equal(row["tokens"], [S] + list(range(10, 17)) + [E])
  # Pair budget L - 4 = 7: a long side gets the rest of a short side's share.
  short_long = ([50, 51], list(range(60, 80)), "grc", "en")
  row = _convert([short_long], 11, pack=False)[0]
  np.testing.assert_array_equal(
      row["tokens"], [S, 50, 51, E, S, 60, 61, 62, 63, 64, E])
  both_long = (list(range(50, 70)), list(range(80, 100)), "grc", "en")
  row = _convert([both_long], 11, pack=False)[0]
  np.testing.assert_array_equal(
      row["tokens"], [S, 50, 51, 52, E, S, 80, 81, 82, 83, E])
  np.testing.assert_array_equal(row["positions"],
                                [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5])


def test_continuous_pair_layout():
  # The released XLM-Align layout: <s> a </s> b </s>, positions run on, side 1 = <s> a </s>, side 2 = b </s>.
  rows = _convert([MONO, PAIR], 13, pack=False, pair_layout="continuous")
  mono, pair = rows
  np.testing.assert_array_equal(mono["tokens"], [S, 10, 11, 12, E] + [0] * 8)  # monolingual: unchanged
  np.testing.assert_array_equal(pair["tokens"], [S, 20, 21, E, 30, 31, 32, E] + [0] * 5)
  np.testing.assert_array_equal(pair["positions"], [0, 1, 2, 3, 4, 5, 6, 7] + [0] * 5)
  np.testing.assert_array_equal(pair["pair_side"], [1] * 4 + [2] * 4 + [0] * 5)
  np.testing.assert_array_equal(pair["lang_ids"], [2] * 4 + [1] * 4 + [0] * 5)
  np.testing.assert_array_equal(pair["segment_ids"], [1] * 8 + [0] * 5)
  # Budget L - 3 = 8 (restart: L - 4 = 7): both long sides keep 4 each; the last position is L - 1.
  both_long = (list(range(50, 70)), list(range(80, 100)), "grc", "en")
  row = _convert([both_long], 11, pack=False, pair_layout="continuous")[0]
  np.testing.assert_array_equal(row["tokens"], [S, 50, 51, 52, 53, E, 80, 81, 82, 83, E])
  np.testing.assert_array_equal(row["positions"], list(range(11)))
  # Packed: positions restart per example, never per side.
  row = _convert([PAIR, MONO], 15, pair_layout="continuous")[0]
  np.testing.assert_array_equal(row["positions"], [0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 0, 0])
  np.testing.assert_array_equal(row["segment_ids"], [1] * 8 + [2] * 5 + [0] * 2)
  # The shortest row holds one token per side: 5 positions.
  assert len(_convert([([7], [8], "en", "grc")], 5, pack=False, pair_layout="continuous")) == 1
  with pytest.raises(errors.UserError, match="too short.*<s> a </s> b </s>"):
    _convert([PAIR], 4, pair_layout="continuous")
  with pytest.raises(errors.UserError, match="pair_layout='xlmr'"):
    fc.XAlignFeatureConverter(["en"], pair_layout="xlmr")


def test_both_directions_adds_each_pair_swapped():
  rows = _convert([PAIR, MONO], 13, pack=False, both_directions=True)
  assert len(rows) == 3  # (a, b), (b, a), then the monolingual example once
  np.testing.assert_array_equal(rows[0]["tokens"], [S, 20, 21, E, S, 30, 31, 32, E] + [0] * 4)
  np.testing.assert_array_equal(rows[1]["tokens"], [S, 30, 31, 32, E, S, 20, 21, E] + [0] * 4)
  np.testing.assert_array_equal(rows[1]["lang_ids"], [1] * 5 + [2] * 4 + [0] * 4)
  np.testing.assert_array_equal(rows[1]["pair_side"], [1] * 5 + [2] * 4 + [0] * 4)
  np.testing.assert_array_equal(rows[2]["tokens"], [S, 10, 11, 12, E] + [0] * 8)
  assert len(_convert([PAIR, MONO], 13, pack=False)) == 2  # off by default


def test_pair_budget_split():
  keep = lambda a, b, n: tuple(int(x) for x in fc.pair_budget(
      tf.constant(a), tf.constant(b), n))
  assert keep(10, 3, 8) == (5, 3)
  assert keep(3, 10, 8) == (3, 5)
  assert keep(10, 10, 7) == (3, 4)
  assert keep(2, 2, 8) == (2, 2)


def test_empty_examples_are_dropped():
  rows = _convert([([], [], "en", ""), MONO], 7, pack=False)
  assert len(rows) == 1


def test_unknown_language_fails_with_its_name():
  with pytest.raises(tf.errors.InvalidArgumentError, match="Unknown language"):
    _convert([([5, 6], [], "de", "")], 9, languages=("en",))


def test_bad_configuration_is_a_user_error():
  with pytest.raises(errors.UserError, match="list of language codes"):
    fc.XAlignFeatureConverter("en")
  with pytest.raises(errors.UserError, match="too short"):
    _convert([MONO], 5)
  ds = _dataset([MONO]).map(lambda ex: {"tokens": ex["tokens"]})
  with pytest.raises(errors.UserError, match="lacks the feature 'lang'"):
    fc.XAlignFeatureConverter(["en", "grc"])(ds, {"tokens": 9})
  wide = _dataset([MONO]).map(lambda ex: dict(
      ex, tokens_b=tf.cast(ex["tokens_b"], tf.int64)))
  with pytest.raises(errors.UserError, match="'tokens_b' is int64"):
    fc.XAlignFeatureConverter(["en"])(wide, {"tokens": 9})
  assert fc.XAlignFeatureConverter(["grc", "en", "en"]).languages == (
      "en", "grc")
  with pytest.raises(errors.UserError, match="must be a flax_xalign"):
    fc.XAlignFeatureConverter(["en"], specials={"pad": 0})


def _plain(examples, keep):
  """Examples of a plain seqio task that outputs only the `keep` features."""
  return _dataset(examples).map(lambda ex: {k: ex[k] for k in keep})


def test_missing_optional_features_mean_monolingual_in_one_language():
  expected = _convert([MONO], 13, pack=False, languages=("en",))
  for keep in (["tokens"], ["tokens", "tokens_b"], ["tokens", "lang"],
               ["tokens", "tokens_b", "lang"]):
    converter = fc.XAlignFeatureConverter(["en"], pack=False)
    rows = list(converter(_plain([MONO], keep), {"tokens": 13})
                .as_numpy_iterator())
    assert len(rows) == 1
    for key, value in expected[0].items():
      np.testing.assert_array_equal(rows[0][key], value)


def test_missing_lang_b_with_one_language_pairs_non_empty_second_sides():
  pair = ([20, 21], [30, 31, 32], "en", "en")
  examples = [pair, MONO]
  expected = _convert(examples, 15, languages=("en",))
  converter = fc.XAlignFeatureConverter(["en"])
  rows = list(converter(_plain(examples, ["tokens", "tokens_b"]),
                        {"tokens": 15}).as_numpy_iterator())
  assert len(rows) == len(expected) == 1  # 9 + 5 positions fit one row.
  for row, want in zip(rows, expected):
    for key, value in want.items():
      np.testing.assert_array_equal(row[key], value)
  assert rows[0]["pair_side"].max() == 2


def test_missing_language_features_need_one_language_or_the_feature():
  converter = fc.XAlignFeatureConverter(["de", "en"])
  with pytest.raises(errors.UserError, match="'lang_b'.*second side"):
    converter(_plain([PAIR], ["tokens", "tokens_b", "lang"]), {"tokens": 13})
  with pytest.raises(errors.UserError,
                     match="lacks the feature 'lang' .*one language"):
    converter(_plain([MONO], ["tokens"]), {"tokens": 13})
  # Without tokens_b every example is monolingual: lang_b is not needed.
  rows = list(converter(_plain([MONO], ["tokens", "lang"]), {"tokens": 9})
              .as_numpy_iterator())
  np.testing.assert_array_equal(rows[0]["lang_ids"], [2] * 5 + [0] * 4)


def test_special_ids_come_from_special_tokens():
  other = specials.SpecialTokens(eos=7, bos=8, unk=2, mask=4, first_regular=9)
  converter = fc.XAlignFeatureConverter(["en", "grc"], pack=False,
                                        specials=other)
  pair = list(converter(_dataset([PAIR]), {"tokens": 13})
              .as_numpy_iterator())[0]
  np.testing.assert_array_equal(
      pair["tokens"], [8, 20, 21, 7, 8, 30, 31, 32, 7] + [0] * 4)
  assert converter.specials == other
  assert fc.XAlignFeatureConverter(["en"]).specials == specials.PROJECT


# ------------------------------------------- padding ids other than 0 (XLM-R)

XLMR = specials.SpecialTokens(bos=0, pad=1, eos=2, unk=3, mask=60,
                              first_regular=4, end_regular=60)


def _random_examples(seed, count=60):
  """Monolingual examples and pairs of varied lengths, regular ids 5..59."""
  rng = np.random.default_rng(seed)
  examples = []
  for _ in range(count):
    a = rng.integers(5, 60, rng.integers(0, 12)).tolist()
    if rng.random() < 0.4:
      b = rng.integers(5, 60, rng.integers(1, 12)).tolist()
      examples.append((a or [7], b, "grc", "en"))
    else:
      examples.append((a, [], str(rng.choice(["en", "grc"])), ""))
  return examples


def test_xlmr_padding_unpacked_and_packed():
  converter = fc.XAlignFeatureConverter(["en", "grc"], pack=False,
                                        specials=XLMR)
  mono, pair = converter(_dataset([MONO, PAIR]), {"tokens": 13}
                         ).as_numpy_iterator()
  np.testing.assert_array_equal(mono["tokens"], [0, 10, 11, 12, 2] + [1] * 8)
  np.testing.assert_array_equal(mono["segment_ids"], [1] * 5 + [0] * 8)
  np.testing.assert_array_equal(mono["positions"], [0, 1, 2, 3, 4] + [0] * 8)
  np.testing.assert_array_equal(
      pair["tokens"], [0, 20, 21, 2, 0, 30, 31, 32, 2] + [1] * 4)
  np.testing.assert_array_equal(
      pair["positions"], [0, 1, 2, 3, 0, 1, 2, 3, 4] + [0] * 4)
  np.testing.assert_array_equal(pair["pair_side"], [1] * 4 + [2] * 5 + [0] * 4)
  packed = fc.XAlignFeatureConverter(["en", "grc"], specials=XLMR)
  rows = list(packed(_dataset([MONO, PAIR, ([40], [], "grc", "")]),
                     {"tokens": 15}).as_numpy_iterator())
  # <s> = 0 inside a row does not end an example: the same rows as our layout.
  np.testing.assert_array_equal(
      rows[0]["tokens"], [0, 10, 11, 12, 2, 0, 20, 21, 2, 0, 30, 31, 32, 2, 1])
  np.testing.assert_array_equal(rows[0]["segment_ids"], [1] * 5 + [2] * 9 + [0])
  np.testing.assert_array_equal(
      rows[0]["positions"], [0, 1, 2, 3, 4, 0, 1, 2, 3, 0, 1, 2, 3, 4, 0])
  np.testing.assert_array_equal(rows[1]["tokens"], [0, 40, 2] + [1] * 12)


# Packing is what the test is about; the unpacked layout with XLM-R ids is test_xlmr_padding_unpacked_and_packed's.
@pytest.mark.fast("True")
@pytest.mark.parametrize("pack", [True, False])
def test_xlmr_batches_are_project_batches_with_specials_moved(pack):
  """Packing decisions do not depend on where the special ids are."""
  examples = _random_examples(0)
  moved = np.arange(61)
  moved[[0, 1, 3]] = [XLMR.pad, XLMR.eos, XLMR.bos]  # 0 pad, 1 </s>, 3 <s>.
  ours = _convert(examples, 17, pack=pack)
  converter = fc.XAlignFeatureConverter(["en", "grc"], pack=pack,
                                        specials=XLMR)
  theirs = list(converter(_dataset(examples), {"tokens": 17})
                .as_numpy_iterator())
  assert len(theirs) == len(ours) > 10
  for want, row in zip(ours, theirs):
    np.testing.assert_array_equal(row["tokens"], moved[want["tokens"]])
    for key in ("segment_ids", "positions", "pair_side", "lang_ids"):
      np.testing.assert_array_equal(row[key], want[key], err_msg=key)
    padding = row["segment_ids"] == 0
    assert (row["tokens"][padding] == XLMR.pad).all()
    assert (row["tokens"][~padding] != XLMR.pad).all()


# ---------------------------------- our layout: the same batches as before

def _shift_positions(ex):
  return {k: v + 1 if k in ("positions", "pair_side") else v
          for k, v in ex.items()}


class _UnshiftedTokensConverter(fc.XAlignFeatureConverter):
  """The converter as it was before padding ids other than 0: `tokens` went
  through seqio's packer unshifted, padding found as tokens == 0. Kept as the
  reference that our own layout (pad = 0) must still match bit for bit."""

  def _convert_features(self, ds, task_feature_lengths):
    length = int(task_feature_lengths["tokens"])
    self._check_inputs(ds)
    ds = self._complete_inputs(ds)
    ds = ds.filter(lambda ex: tf.size(ex["tokens"]) + tf.size(ex["tokens_b"])
                   > 0)
    ds = ds.map(lambda ex: self._layout(ex, length))
    lengths = {k: length for k in fc._LAYOUT_KEYS}
    if self.pack:
      ds = ds.map(_shift_positions)
      ds = seqio.utils.trim_and_pack_dataset(ds, lengths)

      def unpack(ex):
        occupied = tf.cast(tf.not_equal(ex["tokens"], 0), tf.int32)
        return {"tokens": ex["tokens"], "lang_ids": ex["lang_ids"],
                "segment_ids": ex["tokens_segment_ids"],
                "positions": (ex["positions"] - 1) * occupied,
                "pair_side": (ex["pair_side"] - 1) * occupied}

      ds = ds.map(unpack)
    else:
      ds = seqio.utils.trim_and_pad_dataset(ds, lengths)
      ds = ds.map(lambda ex: dict(ex, segment_ids=tf.cast(
          tf.not_equal(ex["tokens"], 0), tf.int32)))
    return ds.map(lambda ex: fc._set_shapes(ex, length))


@pytest.mark.fast("6-True", "40-False")  # Rows shorter than most examples, packed; long rows, unpacked.
@pytest.mark.parametrize("pack", [True, False])
@pytest.mark.parametrize("length", [6, 17, 40])
def test_project_layout_is_bit_identical_to_the_unshifted_converter(pack,
                                                                    length):
  examples = _random_examples(length)
  expected = list(_UnshiftedTokensConverter(["en", "grc"], pack=pack)(
      _dataset(examples), {"tokens": length}).as_numpy_iterator())
  got = _convert(examples, length, pack=pack)
  assert len(got) == len(expected) > 0
  for want, row in zip(expected, got):
    assert set(row) == set(want)
    for key, value in want.items():
      assert row[key].dtype == value.dtype
      np.testing.assert_array_equal(row[key], value, err_msg=key)


@pytest.mark.fast("True-0", "False-1")  # Packed and unpacked; another seed of packed rows in the slow tier.
@pytest.mark.parametrize("pack,seed", [(True, 0), (True, 5), (False, 1)])
def test_project_task_batches_are_bit_identical_to_the_unshifted_converter(
    toy_corpus, monkeypatch, pack, seed):
  """Same tasks, same seeds, through the pipeline: the same batches."""
  from flax_xalign import tasks
  from flax_xalign.data import pipeline
  from flax_xalign.tasks import user

  root, model = toy_corpus
  user.TextTask(name="fc_en", files={"train": str(root / "en.txt")},
                lang="en", vocabulary_path=str(model)).register()
  user.TsvBitextTask(name="fc_de_en", files={"train": str(root / "de_en.tsv")},
                     lang_a="de", lang_b="en",
                     vocabulary_path=str(model)).register()
  user.AlphaMixture(name="fc_mix", tasks=("fc_en", "fc_de_en")).register()
  provider, languages, _ = tasks.resolve("fc_mix")

  def batches(pack, seed):
    ds = pipeline.get_dataset(provider, languages=languages, split="train",
                              feature_lengths={"tokens": 29}, batch_size=3,
                              seed=seed, pack=pack)
    return list(itertools.islice(ds.as_numpy_iterator(), 8))

  got = batches(pack, seed)
  with monkeypatch.context() as patch:
    patch.setattr(fc, "XAlignFeatureConverter", _UnshiftedTokensConverter)
    expected = batches(pack, seed)
  assert len(got) == len(expected) == 8
  for want, batch in zip(expected, got):
    for key, value in want.items():
      np.testing.assert_array_equal(batch[key], value, err_msg=key)
