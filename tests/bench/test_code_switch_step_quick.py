"""Smoke test of bench/code_switch_step.py in --quick mode (tiny sizes; timings are not checked)."""

import json
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
KEYS = ("mlm_ms", "tcs_ms", "scs_ms", "ratio_tcs", "ratio_scs", "ratio", "target_ratio_tcs",
        "target_ratio_scs", "switched_share_tcs", "switched_share_scs", "backend")


@pytest.mark.slow  # ~1 min on a 2-core CPU: three small compiles in a fresh process.
def test_quick_run_ends_with_the_json_summary(tmp_path: pathlib.Path):
  output = tmp_path / "code_switch_step.json"
  proc = subprocess.run([sys.executable, str(REPO / "bench" / "code_switch_step.py"), "--quick",
                         "--output", str(output)],
                        cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
  assert proc.returncode == 0, proc.stderr[-4000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  for key in KEYS:
    assert key in result, key
  assert result["rounds"] == 2 and result["batch"] == 4
  assert min(result["mlm_ms"], result["tcs_ms"], result["scs_ms"]) > 0
  assert result["ratio_tcs"] == pytest.approx(result["tcs_ms"] / result["mlm_ms"])
  assert result["ratio_scs"] == pytest.approx(result["scs_ms"] / result["mlm_ms"])
  assert result["ratio"] == max(result["ratio_tcs"], result["ratio_scs"])
  assert 0.0 < result["switched_share_tcs"] <= 0.2 and 0.0 < result["switched_share_scs"] <= 0.2
  assert json.loads(output.read_text()) == result
  assert "MLM+TCS" in proc.stdout and "MLM+SCS" in proc.stdout  # the readable table
