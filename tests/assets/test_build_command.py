"""The explicit build step: `xalign assets` with the flags of a training run.

It writes the run's assets into MODEL_DIR and nothing else; a training run
with the same flags then trains with those files (a user may curate them in
between), and files that do not belong to the run are refused.
"""

import os

import numpy as np
import pytest

from flax_xalign import train as train_main
from flax_xalign.cli import assets as assets_main
from flax_xalign.data.transforms import dictionary as dictionary_lib
V = 211


def _flags(model_dir, *extra):
  return ["--gin_file=experiments/align_mlm/align_mlm.gin", "--gin_file=experiments/align_mlm/tiny.gin",
          f"--gin.MODEL_DIR='{model_dir}'", "--gin.TRANSFORMS='trans_inv'", f"--gin.SYNTHETIC_VOCAB_SIZE={V}",
          "--gin.MIXTURE_OR_TASK_NAME='synthetic_trans_inv_mlm'", "--gin.TRAIN_STEPS=2",
          "--gin.CHECKPOINT_EVERY=2", "--gin.EVAL_EVERY=2", "--gin.LOG_EVERY=1", "--gin.BATCH_SIZE=4",
          "--gin.TASK_FEATURE_LENGTHS={'tokens': 32}", *extra]


def _build(model_dir, capsys):
  """Builds the run's assets with the command; checks what it printed and wrote; returns the dictionary."""
  assert assets_main.main(_flags(model_dir)) == 0
  out = capsys.readouterr().out
  assert "dictionary:" in out and "token_map:" in out and "vocabulary:" in out
  assert sorted(os.listdir(model_dir)) == [".lock", "dictionary.tsv", "token_map.npz", "vocabulary.model"]
  built = dictionary_lib.load(str(model_dir / "dictionary.tsv"))
  assert len(built) == round(0.25 * (V - 5))
  return built


def test_build_writes_the_run_assets_and_nothing_else(tmp_path, bible_data_dir, capsys):
  """The build half of the test below (which trains as well, in the `slow` tier)."""
  model_dir = tmp_path / "run"
  _build(model_dir, capsys)
  before = {name: (model_dir / name).read_bytes() for name in os.listdir(model_dir) if name != ".lock"}
  assert assets_main.main(_flags(model_dir)) == 0  # Building again changes nothing.
  assert {name: (model_dir / name).read_bytes() for name in os.listdir(model_dir) if name != ".lock"} == before
  assert "already present" in capsys.readouterr().out


@pytest.mark.slow  # Builds, then trains through the entry point (~30 s of CPU).
def test_build_then_train_uses_the_built_files(tmp_path, bible_data_dir, capsys):
  model_dir = tmp_path / "run"
  built = _build(model_dir, capsys)
  # Building again changes nothing.
  before = (model_dir / "dictionary.tsv").read_bytes()
  assert assets_main.main(_flags(model_dir)) == 0
  assert (model_dir / "dictionary.tsv").read_bytes() == before

  # A user curates the dictionary (keeps half of it); training uses exactly that.
  kept = built[::2]
  dictionary_lib.save(str(model_dir / "dictionary.tsv"), kept)
  assert train_main.main(_flags(model_dir)) == 0
  out = capsys.readouterr().out
  assert f"dictionary: {len(kept):,} translation pairs" in out and "loaded from" in out
  saved = dictionary_lib.load(str(model_dir / "checkpoints" / "2" / "assets" / "dictionary.tsv"))
  np.testing.assert_array_equal(saved, kept)


def test_files_of_another_run_are_refused_before_anything_is_written(tmp_path, bible_data_dir, capsys):
  model_dir = tmp_path / "run"
  model_dir.mkdir()
  # Pairs that are not translations in this synthetic language.
  dictionary_lib.save(str(model_dir / "dictionary.tsv"), np.array([[5, 5 + V + 1], [6, 6 + V + 1]]))
  assert train_main.main(_flags(model_dir)) == 2
  err = capsys.readouterr().err
  assert "error:" in err and "does not match this run's synthetic language" in err
  assert sorted(os.listdir(model_dir)) == ["dictionary.tsv"]
