"""Fixtures of the hardening suite: one tiny trained MODEL_DIR per session, copied per test."""

import shutil

import pytest

from tests.hardening import harness

TRAINED_TAG = "hz"


@pytest.fixture(scope="session")
def trained(tmp_path_factory, tiny_corpus):
  """A MODEL_DIR trained 4 steps in-process (checkpoints 2 and 4) and the gin file that made it."""
  root = tmp_path_factory.mktemp("hardening_trained")
  gin_file = harness.write_run_gin(root / "run.gin", tiny_corpus, tag=TRAINED_TAG)
  model_dir = root / "model"
  code = harness.call_main("train", harness.train_argv(gin_file, model_dir, "--gin.TRAIN_STEPS=4"))
  if code != 0:
    pytest.fail(f"the tiny training run of the hardening suite failed (exit {code})")
  return {"gin": gin_file, "dir": model_dir, "tag": TRAINED_TAG}


@pytest.fixture
def trained_copy(trained, tmp_path):
  """A private copy of the trained MODEL_DIR (a test may resume or damage it)."""
  target = tmp_path / "model"
  shutil.copytree(trained["dir"], target, symlinks=True)
  return target
