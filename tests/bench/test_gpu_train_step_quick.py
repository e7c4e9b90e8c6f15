"""Smoke test of bench/gpu_train_step.py on the CPU, in a Python whose imports of TensorFlow, seqio, gin and
clu fail (the GPU hosts it is meant for have none of them): the step runs, and the JSON's MFU is the FLOP
count over the step time and the peak."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]

_WITHOUT_TF = """
import importlib.abc, runpy, sys
class Refuse(importlib.abc.MetaPathFinder):
  def find_spec(self, name, path=None, target=None):
    if name.split(".")[0] in ("tensorflow", "tensorflow_text", "tensorflow_datasets", "seqio", "gin", "clu"):
      raise ModuleNotFoundError(f"No module named {name!r} (refused by the test)")
sys.meta_path.insert(0, Refuse())
sys.argv = ["bench/gpu_train_step.py", *sys.argv[1:]]
runpy.run_path("bench/gpu_train_step.py", run_name="__main__")
"""


@pytest.mark.subprocess  # A fresh interpreter with TensorFlow & co. refused; one tiny compile (~20 s).
def test_runs_without_tensorflow_and_reports_mfu():
  proc = subprocess.run(
      [sys.executable, "-c", _WITHOUT_TF, "--size=tiny", "--batches=2", "--length=16", "--vocab=1000",
       "--steps=2", "--warmup=1", "--skip_peer", "--peak_tflops=1"],
      cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
      env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == 0, proc.stderr[-4000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  (row,) = result["rows"]
  ours = row["ours"]
  assert "error" not in ours, ours
  assert row["batch"] == 2 and row["length"] == 16 and row["flops_per_step"] > 0
  assert ours["tokens_per_s"] == pytest.approx(2 * 16 / ours["step_s"])
  assert ours["mfu"] == pytest.approx(row["flops_per_step"] / ours["step_s"] / 1e12)
  assert 0 < ours["loss"] < 20 and "peer" not in row
