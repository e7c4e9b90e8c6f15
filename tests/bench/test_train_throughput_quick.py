"""Smoke test of bench/train_throughput.py in --quick mode (needs torch)."""

import json
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
KEYS = ("ratio", "ours_tokens_per_sec", "peer_tokens_per_sec", "matmul_gflops",
        "ours_model_gflops", "fraction_of_matmul_peak", "rounds", "config",
        "threads")


@pytest.mark.slow  # ~40-60 s on a 2-core CPU: two compiles plus torch import.
def test_quick_run_ends_with_the_json_summary(tmp_path: pathlib.Path):
  pytest.importorskip("torch")
  pytest.importorskip("transformers")
  output = tmp_path / "train_throughput.json"
  proc = subprocess.run(
      [sys.executable, str(REPO / "bench" / "train_throughput.py"), "--quick",
       "--output", str(output)],
      cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-4000:]
  last_line = proc.stdout.strip().splitlines()[-1]
  result = json.loads(last_line)
  for key in KEYS:
    assert key in result, key
  assert result["rounds"] == 2
  assert result["ours_tokens_per_sec"] > 0
  assert result["peer_tokens_per_sec"] > 0
  assert result["ratio"] == pytest.approx(
      result["ours_tokens_per_sec"] / result["peer_tokens_per_sec"])
  assert 0 < result["fraction_of_matmul_peak"]
  assert json.loads(output.read_text()) == result
  assert "ratio ours/peer" in proc.stdout  # the readable table
