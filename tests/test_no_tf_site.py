"""The stand-in for the bare GPU host (tests/no_tf_site): TensorFlow and seqio are absent in the child."""

import subprocess
import sys

import pytest

from tests import no_tf_site


@pytest.mark.subprocess
def test_the_child_finds_neither_tensorflow_nor_seqio_and_importing_them_fails():
  code = no_tf_site.CHECK + """
import importlib
for name in ("tensorflow", "seqio", "tensorflow_text"):
  try:
    importlib.import_module(name)
    print("IMPORTED", name)
  except ModuleNotFoundError:
    print("REFUSED", name)
import numpy, jax  # what the host has still imports
print("NUMPY", numpy.__name__)
"""
  done = subprocess.run([sys.executable, "-c", code], env=no_tf_site.env(), capture_output=True, text=True,
                        timeout=120, check=False)
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.split() == ["ABSENT", "OK", "REFUSED", "tensorflow", "REFUSED", "seqio", "REFUSED",
                                 "tensorflow_text", "NUMPY", "numpy"], done.stdout
