"""Smoke test of bench/sinkhorn.py on a tiny batch: the table, then one JSON line."""

import json
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.subprocess
def test_tiny_run_prints_the_table_and_ends_with_the_json_summary(tmp_path: pathlib.Path):
  pytest.importorskip("ot")
  output = tmp_path / "sinkhorn.json"
  proc = subprocess.run(
      [sys.executable, str(REPO / "bench" / "sinkhorn.py"), "--batch", "3", "--length", "12", "--min_len", "2",
       "--repeats", "1", "--check_pairs", "3", "--output", str(output)],
      cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-4000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  assert result["ratio"] == pytest.approx(result["pot_ms"] / result["ours_ms"])
  assert result["roofline_passes"] == 5 and result["roofline_ms"] == pytest.approx(5 * result["one_pass_ms"])
  assert result["shape"] == [3, 12, 12] and result["ours_over_roofline"] > 0
  assert set(result["max_abs_diff_vs_pot"]) >= {"ours", "ours_auto"}
  assert all(diff < 1e-3 for diff in result["max_abs_diff_vs_pot"].values())
  assert json.loads(output.read_text()) == result
  assert "roofline (5 passes)" in proc.stdout and "POT (loop, float64)" in proc.stdout
