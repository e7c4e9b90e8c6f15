"""Fixtures of the hardening suite: the session's shared trained MODEL_DIR (tests/shared_run.py), copied per test."""

import pytest

from tests.shared_run import SHARED_TAG

TRAINED_TAG = SHARED_TAG


@pytest.fixture(scope="session")
def trained(shared_run):
  """The shared MODEL_DIR (4 steps, checkpoints 2 and 4): {dir, gin, tag, corpus, ...}; read-only."""
  return shared_run


@pytest.fixture
def trained_copy(shared_run_copy):
  """A private copy of the trained MODEL_DIR (a test may resume or damage it)."""
  return shared_run_copy
