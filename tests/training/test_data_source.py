"""The data-source seam: one `DataSource` interface, `SeqioSource` and `CacheSource`, chosen once from `train.data`.

The checkpoint items are compared with the names every old run has on disk; the cache is a real one written by
`flax_xalign.cli.cache`; the checkpointer is handed only a position and a fake iterator, so it cannot be asking
which backend made it.
"""

import inspect
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from flax_xalign.errors import UserError
from flax_xalign.run_spec import RunSpec, VocabularySpec
from flax_xalign.training import data_positions
from flax_xalign.training.cache_source import CacheSource
from flax_xalign.training.checkpoints import CheckpointConfig, Checkpointer, make_meta
from flax_xalign.training.data import resolve_task
from flax_xalign.training.data_source import DataSource
from flax_xalign.training.seqio_source import SeqioSource
from tests.testlib import tiny_encoder_config

LENGTH = 19
BATCH = dict(feature_lengths={"tokens": LENGTH}, batch_size=6, seed=0)


@pytest.fixture(scope="module")
def cache(tiny_corpus, tmp_path_factory):
  """A 30-row train cache of tiny_mix and its validation split."""
  from flax_xalign.cli import cache as cache_cli

  root = tmp_path_factory.mktemp("source") / "cache"
  assert cache_cli.main(["--task=tiny_mix", f"--output={root}", f"--length={LENGTH}", "--examples=30"]) == 0
  assert cache_cli.main(["--task=tiny_mix", "--split=validation", f"--output={root}", f"--length={LENGTH}"]) == 0
  return str(root)


def test_both_sources_implement_the_interface_with_the_item_names_old_runs_hold():
  for cls in (SeqioSource, CacheSource):
    assert issubclass(cls, DataSource) and not inspect.isabstract(cls), cls
  assert inspect.isabstract(DataSource)
  assert (SeqioSource.kind, SeqioSource.position.item) == ("seqio", "data_iterator")
  assert (CacheSource.kind, CacheSource.position.item) == ("cache", "data_iterator_cache")
  # A reader knows both items whichever source wrote a step.
  assert set(data_positions.handlers()) == {"data_iterator", "data_iterator_cache"}


def test_the_train_data_string_picks_one_source_and_asks_only_it(monkeypatch):
  calls = []
  monkeypatch.setattr(SeqioSource, "resolve", classmethod(lambda cls, name, **kw: calls.append(("seqio", name, kw))))
  monkeypatch.setattr(CacheSource, "open", classmethod(lambda cls, d, name, **kw: calls.append(("cache", d, name, kw))))
  register = object()
  resolve_task("tiny_mix", languages=["en"], register_tasks=register)
  resolve_task("tiny_mix", languages=["en"], data="cache:~/caches/tiny", register_tasks=register)
  # The cache is never asked to register seqio tasks: a host without TF has none to register.
  assert calls == [("seqio", "tiny_mix", {"languages": ["en"], "register_tasks": register}),
                   ("cache", os.path.expanduser("~/caches/tiny"), "tiny_mix",
                    {"languages": ["en"], "verify": "auto", "vocabulary_files": ()})]


@pytest.mark.parametrize("value, says", [
    ("cache:", ("train.data='cache:'", '"cache:DIR"')), ("grain:/x", ("'grain:/x'", '"cache:DIR"')),
    ("/data/c", ("'/data/c'", '"cache:DIR"')),
    ("cache:{missing}", ("the folder does not exist", "--split=train --output={missing}"))])
def test_a_bad_data_value_is_one_clear_error_before_any_registry_lookup(value, says, tmp_path, monkeypatch):
  monkeypatch.setattr(SeqioSource, "resolve", classmethod(lambda *a, **k: pytest.fail("the registry was read")))
  missing = tmp_path / "nowhere"
  with pytest.raises(UserError) as error:
    resolve_task("tiny_mix", data=value.format(missing=missing))
  message = str(error.value)
  for needle in says:  # What is wrong and the fix, on one line.
    assert needle.format(missing=missing) in message, message
  assert "\n" not in message


def test_seqio_and_cache_sources_of_one_task_agree_on_what_a_run_needs(cache):
  seqio = resolve_task("tiny_mix")
  cached = resolve_task("tiny_mix", data=f"cache:{cache}")
  assert isinstance(seqio, SeqioSource) and isinstance(cached, CacheSource)
  for field in ("name", "languages", "language_pairs", "vocabulary_spec"):
    assert getattr(cached, field) == getattr(seqio, field), field
  assert list(cached.definitions) == list(seqio.definitions)  # The manifest keeps a tuple, the registry a list.
  for split, present in (("train", True), ("validation", True), ("test", False)):
    assert seqio.has_split(split) == cached.has_split(split) == present, split
  assert cached.where == f"the packed cache {cache}" and seqio.where == "task tiny_mix"
  assert f"--split=test --output={cache}" in cached.how_to_add_split("test")
  from_seqio, from_cache = next(seqio.batches(**BATCH)), next(cached.batches(**BATCH))
  assert sorted(from_seqio) == sorted(from_cache)
  for key, value in from_seqio.items():
    assert (value.shape, value.dtype) == (from_cache[key].shape, from_cache[key].dtype) == ((6, LENGTH), np.int32)


class _FakePosition:
  """A Grain-like iterator: only get_state/set_state, no backend to look at."""

  def __init__(self, position):
    self.position, self.restored = position, None

  def get_state(self):
    return {"position": self.position}

  def set_state(self, state):
    self.restored = state


def test_the_checkpointer_saves_and_restores_the_position_it_is_handed(tmp_path):
  run = RunSpec(task="fake", languages=("en",), task_feature_lengths={"tokens": 5},
                vocabulary=VocabularySpec(file="vocabulary.model", sha256="ab" * 32, size=61, pieces=61),
                model=tiny_encoder_config(vocab_size=61), objectives={"mlm": 1.0})
  state = {"w": np.arange(3, dtype=np.float32)}
  checkpointer = Checkpointer(str(tmp_path), CheckpointConfig(async_save=False), position=CacheSource.position)
  try:
    checkpointer.save(4, state, _FakePosition(17), make_meta(run, {}), force=True)
    step_dir = tmp_path / "checkpoints" / "4"
    assert "process_0.json" in os.listdir(step_dir / "data_iterator_cache")
    assert not (step_dir / "data_iterator").exists()
    assert json.loads((step_dir / "data_iterator_cache" / "process_0.json").read_text()) == {"position": 17}
    resumed = _FakePosition(0)
    restored, _ = checkpointer.restore(4, state, resumed)
    assert resumed.restored == {"position": 17}
    np.testing.assert_array_equal(restored["w"], state["w"])
  finally:
    checkpointer.close()


@pytest.mark.subprocess  # A fresh interpreter whose import system refuses TensorFlow and seqio.
def test_a_cache_source_reads_batches_without_tensorflow_or_seqio(cache):
  code = f"""
import sys
from tests.training import no_tf_train
sys.meta_path.insert(0, no_tf_train._Finder())
from flax_xalign.training.data import resolve_task
source = resolve_task("tiny_mix", data={"cache:" + cache!r})
batch = next(source.batches(feature_lengths={{"tokens": {LENGTH}}}, batch_size=6, seed=0))
print(type(source).__name__, batch["tokens"].shape)
print("LOADED", sorted(m for m in sys.modules if m.split(".")[0] in no_tf_train.REFUSED))
"""
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root,
                        timeout=300, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "REFUSED IMPORT" not in done.stderr, done.stderr[-3000:]
  assert f"CacheSource ({6}, {LENGTH})" in done.stdout and "LOADED []" in done.stdout, done.stdout
