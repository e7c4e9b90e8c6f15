"""Verifying a packed cache at a run's start: "full" (sha256) and "size" (sizes + a seeded record sample).

The caches are written here by `write.write_split` from random rows of known bounds (no seqio), so each
damage is made by hand against an independent expectation: byte counts from NumPy's itemsize arithmetic,
the sample from NumPy's own seeded generator, the hash calls counted on the function `open_split` uses.
"""

import dataclasses
import hashlib
import io
import json
import os
import shutil

import numpy as np
import pytest

from flax_xalign.data.packed import format as format_lib
from flax_xalign.data.packed import read
from flax_xalign.data.packed import write
from flax_xalign.data.vocab.spec import VocabularySpec
from flax_xalign.errors import UserError

LENGTH, VOCAB, ROWS = 13, 61, 150
VOCAB_BYTES = b"a stand-in vocabulary file"


def _rows(count, seed):
  rng = np.random.default_rng(seed)
  for _ in range(count):
    yield {"tokens": rng.integers(0, VOCAB, LENGTH), "lang_ids": rng.integers(0, 3, LENGTH),
           "segment_ids": rng.integers(0, LENGTH + 1, LENGTH), "positions": rng.integers(0, LENGTH + 1, LENGTH),
           "pair_side": rng.integers(0, 3, LENGTH)}


def write_cache(root, *, split="train", rows=ROWS, length=LENGTH, languages=("de", "en"), vocab=VOCAB_BYTES,
                task="synthetic_mix", shard_bytes=2048, seed=0):
  """A cache split of `rows` random rows, in shards of ~`shard_bytes` (several shards by default)."""
  spec = VocabularySpec(file="vocabulary.model", sha256=hashlib.sha256(vocab).hexdigest(), size=VOCAB, pieces=VOCAB)
  info = write.split_info(task=task, split=split, length=length, pack=True, pair_layout="restart",
                          both_directions=False, languages=languages, language_pairs=(), vocabulary=spec,
                          task_definitions=None, seed=seed, order={"mode": "in order", "examples": rows})
  source = ({k: v[:length] for k, v in row.items()} if length <= LENGTH else
            {k: np.resize(v, length) for k, v in row.items()} for row in _rows(rows, seed))
  write.write_split(source, info, output=str(root), vocabulary_bytes=vocab, shard_bytes=shard_bytes,
                    log=io.StringIO())
  return str(root)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  return write_cache(tmp_path_factory.mktemp("verify") / "cache")


@pytest.fixture
def copy(cache, tmp_path):
  target = tmp_path / "cache"
  shutil.copytree(cache, target)
  return str(target)


def _edit_manifest(root, change):
  path = os.path.join(root, "train", format_lib.MANIFEST)
  with open(path, encoding="utf-8") as f:
    manifest = json.load(f)
  change(manifest)
  with open(path, "w", encoding="utf-8") as f:
    json.dump(manifest, f)


def _one_line_error(call, *needles):
  with pytest.raises(UserError) as error:
    call()
  message = str(error.value)
  assert "\n" not in message, message
  for needle in needles:
    assert needle in message, message
  return message


def test_auto_hashes_below_the_threshold_and_samples_above():
  assert format_lib.verify_mode("auto", format_lib.FULL_BELOW_BYTES - 1) == "full"
  assert format_lib.verify_mode("auto", format_lib.FULL_BELOW_BYTES) == "size"
  assert format_lib.verify_mode("full", 10 << 40) == "full" and format_lib.verify_mode("size", 1) == "size"
  _one_line_error(lambda: format_lib.parse_verify("sha"), "train.cache_verify='sha'", "'full'", "'size'")


@pytest.mark.parametrize("verify, hashed", [("full", True), ("size", False), ("auto", True)])
def test_only_full_mode_hashes_the_shards(cache, monkeypatch, verify, hashed):
  hashed_paths = []
  real = format_lib.sha256_of
  monkeypatch.setattr(format_lib, "sha256_of", lambda path: hashed_paths.append(path) or real(path))
  packed = format_lib.open_split(cache, "train", verify=verify)
  assert len(packed.manifest.shards) >= 3  # Several shards, each sampled.
  assert sorted(hashed_paths) == (sorted(packed.paths) if hashed else [])


def test_the_sample_is_seeded_distinct_and_covers_a_small_shard_whole():
  first = format_lib.sample_indices(10_000, 3)
  assert first == format_lib.sample_indices(10_000, 3) != format_lib.sample_indices(10_000, 4)
  assert len(set(first)) == format_lib.SAMPLE_RECORDS and first == sorted(first)
  assert 0 <= first[0] and first[-1] < 10_000
  assert format_lib.sample_indices(5, 0) == [0, 1, 2, 3, 4]


def test_a_manifest_whose_record_layout_was_edited_is_refused_in_both_modes(copy):
  # tokens uint8 -> uint16: the records hold LENGTH bytes fewer than the manifest's layout says.
  _edit_manifest(copy, lambda m: m["features"].__setitem__(0, ["tokens", "uint16"]))
  itemsize = LENGTH * (1 + 1 + 1 + 1 + 1)  # five uint8 features (bounds 61, 3, 14, 14, 3)
  for verify in ("full", "size"):
    _one_line_error(lambda: format_lib.open_split(copy, "train", verify=verify),
                    f"holds {itemsize} bytes", f"takes {itemsize + LENGTH}", "rebuild the cache")


def test_values_outside_the_manifests_bounds_are_refused_by_the_sample(copy):
  _edit_manifest(copy, lambda m: m["vocabulary"].update(size=10))  # uint8 either way: same record size.
  _one_line_error(lambda: format_lib.open_split(copy, "train", verify="size"), "tokens value", "outside [0, 10)")


def test_a_record_count_other_than_the_manifests_is_refused(copy):
  def change(m):
    m["shards"][0]["examples"] += 1
    m["examples"] += 1
  _edit_manifest(copy, change)
  _one_line_error(lambda: format_lib.open_split(copy, "train", verify="size"), "shard-00000", "records, the manifest")


def test_a_truncated_shard_is_refused_by_its_size_without_hashing(copy, monkeypatch):
  monkeypatch.setattr(format_lib, "sha256_of", lambda path: pytest.fail("size mode hashed a shard"))
  shard = os.path.join(copy, "train", format_lib.shard_name(1))
  with open(shard, "r+b") as f:
    f.truncate(os.path.getsize(shard) - 7)
  _one_line_error(lambda: format_lib.open_split(copy, "train", verify="size"), "bytes, the manifest says")


def test_a_changed_byte_is_refused_by_full_and_never_read_silently_by_size(copy):
  shard = os.path.join(copy, "train", format_lib.shard_name(0))
  with open(shard, "r+b") as f:
    f.seek(1000)  # Inside the records' chunks (the file is padded to 64 KiB blocks; padding is never read).
    byte = f.read(1)
    f.seek(-1, os.SEEK_CUR)
    f.write(bytes([byte[0] ^ 0x40]))
  _one_line_error(lambda: format_lib.open_split(copy, "train", verify="full"), "sha256")
  # "size" does not hash: the damage is found by the sample or, at the latest, when its record is read
  # (Riegeli's chunk hash), as one UserError; never decoded as a row.
  with pytest.raises(UserError) as error:
    packed = format_lib.open_split(copy, "train", verify="size")
    for _ in read.PackedBatches(packed, batch_size=6, seed=None, shuffle=False, num_epochs=1, num_threads=1):
      pass
  message = str(error.value)
  assert "\n" not in message and ("shard-00000" in message or "cannot be read" in message), message


def test_the_reader_refuses_a_record_of_another_size_before_decoding_it(cache):
  packed = format_lib.open_split(cache, "train", verify="size")
  # A manifest that promises wider records than the shards hold, past `open_split`'s sample.
  wider = dataclasses.replace(packed.manifest, features=tuple((n, "uint16") for n, _ in packed.manifest.features))
  batches = read.PackedBatches(format_lib.PackedSplit(packed.directory, wider), batch_size=6, seed=0)
  message = _one_line_error(lambda: next(batches), f"holds {LENGTH * 5} bytes", f"takes {LENGTH * 10}")
  assert packed.directory in message


def test_decode_refuses_a_short_record_and_reads_a_right_one():
  dtype = format_lib.record_dtype([("tokens", "uint8"), ("positions", "uint16")], 3)
  assert dtype.itemsize == 3 + 6
  good = bytes([1, 2, 3]) + np.array([0, 1, 2], "<u2").tobytes()
  assert format_lib.decode([good], dtype)["positions"].tolist() == [[0, 1, 2]]
  _one_line_error(lambda: format_lib.decode([good, good[:-1]], dtype, where="shard X"), "shard X holds 8 bytes")
