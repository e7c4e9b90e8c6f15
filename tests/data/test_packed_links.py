"""Word links in the packed cache: `link_groups` written by `xalign cache`, read back as the seqio pipeline gives them.

The reference is the seqio pipeline's own batches with `links=True` (`pipeline.get_dataset`, what a run from
seqio trains on) for the same task, seed and order; the links are random (several per word, some words
unlinked), so a group number that moved, was cut to a narrower dtype or lost its side would show.
"""

import os
import random

import numpy as np
import pytest

from flax_xalign.data import pipeline
from flax_xalign.data.packed import format as format_lib
from flax_xalign.data.packed import read
from flax_xalign.errors import UserError

LENGTH, ROWS, SEED = 19, 36, 3
TASK = "linked_de_en"


def register_linked_task(tiny_corpus, directory, name=TASK) -> str:
  """tiny_corpus's de-en bitext with random word links (Pharaoh files for train and validation), registered."""
  from flax_xalign.tasks import user

  rng = random.Random(7)
  links = {}
  for split in ("train", "validation"):
    lines = []
    for line in open(tiny_corpus["files"][("de_en", split)], encoding="utf-8"):
      if not line.strip():
        continue
      a, b = (len(side.split()) for side in line.split("\t"))
      pairs = {(rng.randrange(a), rng.randrange(b)) for _ in range(rng.randrange(0, a + b))}
      lines.append(" ".join(f"{i}-{j}" for i, j in sorted(pairs)))
    path = os.path.join(directory, f"{name}.{split}.links")
    with open(path, "w", encoding="utf-8") as f:
      f.write("\n".join(lines) + "\n")
    links[split] = path
  user.TsvBitextTask(name=name, files={s: tiny_corpus["files"][("de_en", s)] for s in ("train", "validation")},
                     lang_a="de", lang_b="en", vocabulary_path=tiny_corpus["vocab"], links=links).register()
  return name


@pytest.fixture(scope="module")
def linked(tiny_corpus, tmp_path_factory):
  """The linked task; a cache of it written with its links by default, and one written with --no-links."""
  from flax_xalign.cli import cache as cache_cli

  root = tmp_path_factory.mktemp("packed_links")
  register_linked_task(tiny_corpus, str(root))
  common = [f"--task={TASK}", f"--length={LENGTH}", f"--seed={SEED}"]
  assert cache_cli.main([*common, f"--output={root / 'cache'}", f"--examples={ROWS}"]) == 0
  assert cache_cli.main([*common, f"--output={root / 'cache'}", "--split=validation", "--both_directions",
                         "--pair_layout=continuous", "--no_pack"]) == 0
  assert cache_cli.main([*common, f"--output={root / 'plain'}", f"--examples={ROWS}", "--no-links"]) == 0
  return {"cache": str(root / "cache"), "plain": str(root / "plain")}


def _seqio_rows(split, count, **layout):
  from flax_xalign.training.data import resolve_task

  data = resolve_task(TASK)
  ds = pipeline.get_dataset(data.provider, languages=data.languages, split=split, feature_lengths={"tokens": LENGTH},
                            batch_size=6 if count else 1, seed=SEED, specials=data.vocabulary_spec.specials,
                            links=True, **layout)
  batches = list((ds.take(count // 6) if count else ds).as_numpy_iterator())
  return {name: np.concatenate([b[name] for b in batches]) for name in batches[0]}


def _cached_rows(root, split, **kwargs):
  packed = format_lib.open_split(root, split)
  batches = list(read.PackedBatches(packed, batch_size=1, seed=None, shuffle=False, num_epochs=1, **kwargs))
  return packed.manifest, {name: np.concatenate([b[name] for b in batches]) for name in batches[0]}


@pytest.mark.parametrize("split, layout", [
    ("train", {}),
    ("validation", dict(shuffle=False, num_epochs=1, pack=False, both_directions=True, pair_layout="continuous"))],
    ids=["train_packed_shuffled", "validation_unpacked_both_directions"])
def test_cached_rows_are_the_seqio_rows_with_their_link_groups(linked, split, layout):
  manifest, cached = _cached_rows(linked["cache"], split)
  expected = _seqio_rows(split, ROWS if split == "train" else 0, **layout)
  assert manifest.links and manifest.features[-1] == ("link_groups", "uint16")
  assert sorted(cached) == sorted(expected) == sorted([*format_lib.FEATURES, "link_groups"])
  for name, values in expected.items():  # Feature by feature, row by row, in the written order.
    np.testing.assert_array_equal(cached[name], values, err_msg=name)
  groups = expected["link_groups"]
  assert (groups > 0).mean() > 0.2 and groups.max() > 3  # Real links, not the zeros of a task without them.


def test_a_cache_without_links_holds_the_five_features(linked):
  manifest, cached = _cached_rows(linked["plain"], "train")
  expected = _seqio_rows("train", ROWS)
  assert not manifest.links and sorted(cached) == sorted(format_lib.FEATURES)
  for name in format_lib.FEATURES:  # The same rows, the links left out.
    np.testing.assert_array_equal(cached[name], expected[name], err_msg=name)


def test_a_run_reads_link_groups_only_when_its_objectives_ask(linked):
  from flax_xalign.training.data import resolve_task

  source = resolve_task(TASK, data=f"cache:{linked['cache']}")
  args = dict(feature_lengths={"tokens": LENGTH}, batch_size=6, seed=0)
  with_links, without = next(source.batches(**args, links=True)), next(source.batches(**args))
  assert sorted(with_links) == sorted([*format_lib.FEATURES, "link_groups"])
  assert sorted(without) == sorted(format_lib.FEATURES)  # As seqio's batches without links=True.
  for name in format_lib.FEATURES:
    np.testing.assert_array_equal(with_links[name], without[name])
  assert with_links["link_groups"].dtype == np.int32


def test_a_run_that_needs_links_is_refused_by_a_cache_without_them(linked, tmp_path):
  import shutil

  from flax_xalign.training.data import resolve_task

  args = dict(feature_lengths={"tokens": LENGTH}, batch_size=6, seed=0, links=True)
  plain = resolve_task(TASK, data=f"cache:{linked['plain']}")
  with pytest.raises(UserError) as error:
    plain.batches(**args)
  message = str(error.value)
  assert "link_groups" in message and "--links" in message and linked["plain"] in message and "\n" not in message
  next(plain.batches(**{**args, "links": False}))  # The same cache serves a run without links.
  # Train split with links, evaluation split without: refused when the training batches are made.
  mixed = tmp_path / "mixed"
  shutil.copytree(os.path.join(linked["cache"], "train"), mixed / "train")
  shutil.copytree(os.path.join(linked["plain"], "train"), mixed / "validation")
  manifest = mixed / "validation" / format_lib.MANIFEST
  manifest.write_text(manifest.read_text().replace('"split": "train"', '"split": "validation"'))
  with pytest.raises(UserError, match=r"packed cache .*validation was written without them"):
    resolve_task(TASK, data=f"cache:{mixed}").batches(**args)


def test_a_link_group_past_the_stored_bound_is_refused():
  info_bounds = format_lib.feature_bounds(vocab_size=61, num_languages=2, length=7)
  dtype = format_lib.record_dtype([(n, format_lib.dtype_for(info_bounds[n])) for n in
                                   format_lib.feature_names(True)], 7)
  row = {name: np.zeros(7, np.int32) for name in format_lib.feature_names(True)}
  row["link_groups"][3] = 65535
  assert format_lib.decode([format_lib.encode(row, dtype, info_bounds)], dtype)["link_groups"][0, 3] == 65535
  row["link_groups"][3] = 65536
  with pytest.raises(ValueError, match="link_groups"):
    format_lib.encode(row, dtype, info_bounds)


def test_a_link_run_resumes_at_the_saved_position_with_its_links(linked):
  """The position saved in a checkpoint (get_state, JSON) continues with the uninterrupted run's link batches."""
  import json

  from flax_xalign.training.data import resolve_task

  args = dict(feature_lengths={"tokens": LENGTH}, batch_size=6, seed=11, links=True)
  source = resolve_task(TASK, data=f"cache:{linked['cache']}")
  straight = source.batches(**args)
  expected = [next(straight) for _ in range(9)]  # 54 rows of 36: the run passes an epoch boundary.
  first = source.batches(**args)
  for _ in range(4):
    next(first)
  state = json.loads(json.dumps(first.get_state()))
  resumed = source.batches(**args)
  resumed.set_state(state)
  for want in expected[4:]:
    got = next(resumed)
    assert sorted(got) == sorted(want)
    for name in want:
      np.testing.assert_array_equal(got[name], want[name], err_msg=name)
