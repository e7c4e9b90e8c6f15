"""The packed cache: what `xalign cache` writes is the seqio pipeline's rows, read back through Grain.

References are independent of the cache code: the seqio pipeline's own batches (`get_dataset`), NumPy set
and permutation arithmetic, and byte-level damage made here.
"""

import collections
import json
import os
import shutil

import numpy as np
import pytest

from flax_xalign.data import pipeline
from flax_xalign.data.packed import format as format_lib
from flax_xalign.data.packed import read
from flax_xalign.errors import UserError

LENGTH, ROWS, SEED = 19, 60, 3


def _rows_key(batch):
  """Each row of a batch as one hashable tuple over every feature."""
  names = sorted(batch)
  return [tuple(np.concatenate([batch[n][i] for n in names]).tolist()) for i in range(len(batch[names[0]]))]


@pytest.fixture(scope="module")
def cache(tiny_corpus, tmp_path_factory):
  """A train cache of tiny_mix (the first ROWS rows of the seed-SEED stream) and its validation split."""
  from flax_xalign.cli import cache as cache_cli

  root = tmp_path_factory.mktemp("packed") / "cache"
  assert cache_cli.main(["--task=tiny_mix", f"--output={root}", f"--length={LENGTH}", f"--examples={ROWS}",
                         f"--seed={SEED}"]) == 0
  assert cache_cli.main(["--task=tiny_mix", "--split=validation", f"--output={root}", f"--length={LENGTH}"]) == 0
  return str(root)


@pytest.fixture(scope="module")
def seqio_rows(tiny_corpus):
  """The reference: the first ROWS rows of the same stream, as the trainer's seqio batches of 6 hold them."""
  from flax_xalign.training.data import resolve_task

  data = resolve_task("tiny_mix")
  ds = pipeline.get_dataset(data.provider, languages=data.languages, split="train",
                            feature_lengths={"tokens": LENGTH}, batch_size=6, seed=SEED,
                            specials=data.vocabulary_spec.specials)
  rows = []
  for batch in ds.take(ROWS // 6).as_numpy_iterator():
    rows += _rows_key(batch)
  return rows


def test_written_rows_are_the_seqio_streams_rows_in_order(cache, seqio_rows):
  packed = format_lib.open_split(cache, "train")
  batches = read.PackedBatches(packed, batch_size=6, seed=None, shuffle=False, num_epochs=1)
  rows = [row for batch in batches for row in _rows_key(batch)]
  assert rows == seqio_rows
  m = packed.manifest
  assert m.examples == ROWS and m.task == "tiny_mix" and m.length == LENGTH and m.languages == ("de", "en")
  assert m.order == {"shuffled": True, "examples": ROWS} and m.seed == SEED
  # 83 ids, 2 languages, rows of 19: every feature fits a byte.
  assert dict(m.features) == {name: "uint8" for name in format_lib.FEATURES}


def test_each_epoch_is_a_new_permutation_of_all_rows(cache, seqio_rows):
  packed = format_lib.open_split(cache, "train")
  batches = read.PackedBatches(packed, batch_size=6, seed=7)
  epochs = []
  for _ in range(2):
    epochs.append([row for _ in range(ROWS // 6) for row in _rows_key(next(batches))])
  for epoch in epochs:
    assert collections.Counter(epoch) == collections.Counter(seqio_rows)
  assert epochs[0] != seqio_rows and epochs[0] != epochs[1]
  again = read.PackedBatches(packed, batch_size=6, seed=7)
  assert [row for _ in range(ROWS // 6) for row in _rows_key(next(again))] == epochs[0]  # Same seed, same order.


def test_processes_read_disjoint_rows_of_the_same_global_batch(cache):
  packed = format_lib.open_split(cache, "train")
  whole = read.PackedBatches(packed, batch_size=6, seed=1)
  halves = [read.PackedBatches(packed, batch_size=6, seed=1, rows=rows) for rows in ((0, 3), (3, 6))]
  for _ in range(12):  # Past the end of the first epoch.
    batch, parts = next(whole), [next(h) for h in halves]
    for name in format_lib.FEATURES:
      np.testing.assert_array_equal(batch[name], np.concatenate([p[name] for p in parts]))
      assert batch[name].dtype == np.int32 and batch[name].shape == (6, LENGTH)


def test_a_restored_position_continues_with_the_next_batch(cache):
  packed = format_lib.open_split(cache, "train")
  first = read.PackedBatches(packed, batch_size=6, seed=2)
  for _ in range(13):
    next(first)
  state = json.loads(json.dumps(first.get_state()))  # As the checkpoint stores it.
  expected = [next(first) for _ in range(3)]
  resumed = read.PackedBatches(packed, batch_size=6, seed=2)
  resumed.set_state(state)
  for want in expected:
    got = next(resumed)
    for name in format_lib.FEATURES:
      np.testing.assert_array_equal(got[name], want[name])
  other = read.PackedBatches(packed, batch_size=6, seed=3)
  with pytest.raises(UserError, match="seed 2"):
    other.set_state(state)


def test_reading_the_cache_imports_neither_tensorflow_nor_seqio():
  import ast
  import pathlib

  folder = pathlib.Path(format_lib.__file__).parent
  for name in ("format.py", "read.py", "write.py"):
    tree = ast.parse((folder / name).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])}
    assert not imported & {"tensorflow", "seqio", "tensorflow_text"}, (name, imported)


# --- damage and mismatches: one UserError naming the file and the fix -----------------------------------


@pytest.fixture
def copy(cache, tmp_path):
  target = tmp_path / "cache"
  shutil.copytree(cache, target)
  return str(target)


def _shard(root):
  return os.path.join(root, "train", format_lib.shard_name(0))


def test_a_truncated_shard_is_refused_by_its_length(copy):
  with open(_shard(copy), "r+b") as f:
    f.truncate(os.path.getsize(_shard(copy)) - 10)
  with pytest.raises(UserError, match="bytes, the manifest says"):
    format_lib.open_split(copy, "train")


def test_a_changed_byte_is_refused_by_the_sha256(copy):
  with open(_shard(copy), "r+b") as f:
    f.seek(100)
    byte = f.read(1)
    f.seek(100)
    f.write(bytes([byte[0] ^ 1]))
  with pytest.raises(UserError, match="sha256"):
    format_lib.open_split(copy, "train")


def test_missing_shard_manifest_and_split_are_named(copy):
  with pytest.raises(UserError, match="it holds the split.s. train, validation"):
    format_lib.open_split(copy, "test")
  os.remove(_shard(copy))
  with pytest.raises(UserError, match="shard .* is missing"):
    format_lib.open_split(copy, "train")
  with pytest.raises(UserError, match="does not exist"):
    format_lib.open_split(copy + "-nowhere", "train")


def test_a_manifest_of_another_format_version_is_refused(copy):
  path = os.path.join(copy, "train", format_lib.MANIFEST)
  manifest = json.load(open(path))
  manifest["version"] = 99
  json.dump(manifest, open(path, "w"))
  with pytest.raises(UserError, match="version 99"):
    format_lib.open_split(copy, "train")


def test_settings_of_another_run_and_a_batch_larger_than_the_cache_are_refused(cache):
  packed = format_lib.open_split(cache, "train")
  with pytest.raises(UserError, match="row length 19, this run uses 21"):
    packed.check_run(task="tiny_mix", length=21, pair_layout="restart", both_directions=False)
  with pytest.raises(UserError, match="task 'tiny_mix', this run uses 'tiny_en'"):
    packed.check_run(task="tiny_en", length=LENGTH, pair_layout="restart", both_directions=False)
  with pytest.raises(UserError, match="pair layout"):
    packed.check_run(task="tiny_mix", length=LENGTH, pair_layout="continuous", both_directions=False)
  with pytest.raises(UserError, match=f"holds {ROWS} rows, fewer than one global batch"):
    read.PackedBatches(packed, batch_size=ROWS + 1, seed=0)


def test_a_value_outside_its_features_bound_is_not_written():
  dtype = format_lib.record_dtype([("tokens", "uint8")], 3)
  assert len(format_lib.encode({"tokens": np.array([1, 2, 82])}, dtype, {"tokens": 83})) == 3
  with pytest.raises(ValueError, match="outside"):
    format_lib.encode({"tokens": np.array([1, 2, 83])}, dtype, {"tokens": 83})
  assert format_lib.dtype_for(256) == "uint8" and format_lib.dtype_for(257) == "uint16"
  assert format_lib.dtype_for(250_002) == "uint32"


def test_the_data_setting_is_seqio_or_a_cache_folder():
  assert format_lib.parse_source("seqio") is None
  assert format_lib.parse_source("cache:/data/c") == "/data/c"
  for bad in ("cache:", "/data/c", "grain:/x"):
    with pytest.raises(UserError, match="is not a data source"):
      format_lib.parse_source(bad)
