"""Tests for flax_xalign.data.pipeline on small user tasks (fast, no Bible)."""

import numpy as np
import pytest
import tensorflow as tf

from flax_xalign import errors
from flax_xalign import tasks
from flax_xalign.data import pipeline
from flax_xalign.data.vocab import specials
from flax_xalign.tasks import user
from tests import testlib

L = 13


@pytest.fixture(scope="module")
def mixture(toy_corpus):
  root, model = toy_corpus
  user.TextTask(name="pipe_en_mlm",
                files={"train": str(root / "en.txt"),
                       "validation": str(root / "en_dev.txt")},
                lang="en", vocabulary_path=str(model)).register()
  user.TsvBitextTask(name="pipe_de_en_tlm",
                     files={"train": str(root / "de_en.tsv"),
                            "validation": str(root / "de_en.tsv")},
                     lang_a="de", lang_b="en",
                     vocabulary_path=str(model)).register()
  user.AlphaMixture(name="pipe_mix",
                    tasks=("pipe_en_mlm", "pipe_de_en_tlm")).register()
  return "pipe_mix"


def _get_dataset(name, **kwargs):
  """The caller's side of the API: resolve the name, then build the data."""
  provider, languages, _ = tasks.resolve(name)
  return pipeline.get_dataset(provider, languages=languages, **kwargs), languages


def _batches(name, n, **kwargs):
  args = dict(split="train", feature_lengths={"tokens": L}, batch_size=3,
              seed=0)
  args.update(kwargs)
  ds, languages = _get_dataset(name, **args)
  it = iter(ds)
  return [next(it) for _ in range(n)], languages


def _same(a, b):
  return all(np.array_equal(x[k], y[k]) for x, y in zip(a, b) for k in x)


def test_batches_have_the_model_features(mixture):
  batches, languages = _batches(mixture, 1)
  assert languages == ("de", "en")
  batch = batches[0]
  assert sorted(batch) == sorted(
      ["tokens", "lang_ids", "segment_ids", "positions", "pair_side"])
  for value in batch.values():
    assert value.shape == (3, L) and value.dtype == tf.int32
  assert set(np.unique(batch["lang_ids"].numpy())) <= {0, 1, 2}


def test_same_seed_same_batches_other_seed_differs(mixture):
  first, _ = _batches(mixture, 3, seed=5)
  again, _ = _batches(mixture, 3, seed=5)
  other, _ = _batches(mixture, 3, seed=6)
  assert _same(first, again)
  assert not _same(first, other)


def test_iterator_checkpoint_restores_the_stream(mixture, tmp_path):
  ds, _ = _get_dataset(mixture, split="train", feature_lengths={"tokens": L},
                       batch_size=3, seed=1)
  expected, restored = testlib.iterator_checkpoint_round_trip(ds, tmp_path, skip=4)
  assert _same(expected, restored)


def test_eval_pass_reads_every_task_once(mixture):
  ds, _ = _get_dataset(mixture, split="validation",
                       feature_lengths={"tokens": 40}, batch_size=1,
                       seed=None, shuffle=False, pack=False, num_epochs=1)
  rows = list(ds.as_numpy_iterator())
  assert len(rows) == 40 + 120  # en_dev.txt lines + de_en.tsv pairs.
  sides = [int(r["pair_side"].max()) for r in rows]
  # Round-robin until the smaller task runs out, then the rest of the larger.
  assert sides == [0, 2] * 40 + [2] * 80


def test_shards_are_disjoint(mixture):
  del mixture
  seen = []
  for shard in (0, 1):
    ds, _ = _get_dataset(
        "pipe_en_mlm", split="validation", feature_lengths={"tokens": 40},
        batch_size=1, seed=3, shuffle=True, pack=False, num_epochs=1,
        shard_id=shard, num_shards=2)
    seen.append({r["tokens"].tobytes() for r in ds.as_numpy_iterator()})
  assert len(seen[0]) + len(seen[1]) >= 38  # Duplicated lines may collide.
  assert not seen[0] & seen[1]


def test_bad_arguments(mixture):
  with pytest.raises(errors.UserError, match="Did you mean 'pipe_mix'"):
    _batches("pipe_mixx", 1)
  with pytest.raises(errors.UserError, match="no split 'test'"):
    _batches(mixture, 1, split="test")
  with pytest.raises(errors.UserError, match="exactly one key, 'tokens'"):
    _batches(mixture, 1, feature_lengths={"inputs": 13})
  with pytest.raises(errors.UserError, match="shard_id=2"):
    _batches(mixture, 1, shard_id=2, num_shards=2)
  provider, languages, _ = tasks.resolve(mixture)
  args = dict(split="train", feature_lengths={"tokens": L}, batch_size=3,
              seed=0)
  with pytest.raises(errors.UserError, match=r"tasks.resolve\(name\)"):
    pipeline.get_dataset(mixture, languages=languages, **args)
  # XLM-R's layout (pad 1) is accepted: padding comes out as the pad id.
  xlmr = specials.SpecialTokens(bos=0, pad=1, eos=2, unk=3, mask=4)
  batch = next(pipeline.get_dataset(provider, languages=languages, **args, specials=xlmr).as_numpy_iterator())
  assert (batch["tokens"][batch["segment_ids"] == 0] == 1).all()


def test_specials_frame_each_side(mixture):
  """<s>/</s> come from the SpecialTokens given (same layout, other ids)."""
  args = dict(split="validation", feature_lengths={"tokens": 40},
              batch_size=1, seed=None, shuffle=False, pack=False, num_epochs=1)
  provider, languages, _ = tasks.resolve(mixture)
  project = next(pipeline.get_dataset(provider, languages=languages, **args)
                 .as_numpy_iterator())
  other = specials.SpecialTokens(eos=2, unk=1, bos=4, mask=3)
  swapped = next(pipeline.get_dataset(provider, languages=languages, **args,
                                      specials=other).as_numpy_iterator())
  tokens = project["tokens"]
  expected = np.where(tokens == specials.PROJECT.bos, 4,
                      np.where(tokens == specials.PROJECT.eos, 2, tokens))
  assert (tokens == specials.PROJECT.bos).sum() == 1  # One monolingual row.
  np.testing.assert_array_equal(swapped["tokens"], expected)
  for key in ("lang_ids", "positions", "segment_ids", "pair_side"):
    np.testing.assert_array_equal(swapped[key], project[key])


def test_eval_pass_keeps_the_listed_order_of_the_mixture(mixture):
  """seqio.Mixture.tasks sorts by name; the pass reads the listed order."""
  provider = tasks.get_provider(mixture)
  assert [t.name for t in provider.tasks] == ["pipe_de_en_tlm", "pipe_en_mlm"]
  assert [t.name for t in pipeline.tasks_of(provider)] == [
      "pipe_en_mlm", "pipe_de_en_tlm"]
  assert tasks.task_names(mixture) == ("pipe_en_mlm", "pipe_de_en_tlm")
