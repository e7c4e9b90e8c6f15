"""Smoke test of bench/csls.py at a tiny size: the table, then one JSON line with agreeing top-k."""

import json
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def _have_faiss() -> bool:
  try:
    import faiss  # noqa: F401
  except ImportError:
    return False
  return True


@pytest.mark.subprocess
def test_quick_run_prints_the_table_and_ends_with_the_json_summary(tmp_path: pathlib.Path):
  output = tmp_path / "csls.json"
  proc = subprocess.run(
      [sys.executable, str(REPO / "bench" / "csls.py"), "--quick", "--n", "600", "--dim", "16", "--block", "128",
       "--output", str(output)],
      cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-4000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  assert json.loads(output.read_text()) == result
  (size,) = result["sizes"]
  assert size["n"] == 600 and size["dim"] == 16 and result["block"] == 128
  expected = {"ours", "numpy"} | ({"faiss"} if _have_faiss() else set())
  assert set(size["methods"]) == expected
  for pair, agree in size["agreement"].items():
    assert agree["agree_rows"] >= 0.99 and agree["agree_entries"] >= 0.998, pair
  for method in expected:
    assert size[f"{method}_s"] > 0 and size[f"{method}_peak_mib"] >= size[f"{method}_loaded_mib"] > 0
  if _have_faiss():
    assert result["ratio"] == pytest.approx(size["ours_s"] / size["faiss_s"])
  else:
    assert result["ratio"] is None
  assert "ours" in proc.stdout and "dense [n, n] float32 matrix" in proc.stdout
