"""Smoke test of bench/cache_read.py in-process on a small synthetic cache (rates are not checked, only that
every measurement is there, the synthetic cache is deleted, and the H100 rate is the hand-computed one)."""

import json
import os

import pytest

from tests import testlib


@pytest.fixture(scope="module")
def bench():
  return testlib.load_bench("cache_read.py")


def test_quick_run_measures_both_modes_deletes_its_cache_and_ends_with_the_json(bench, tmp_path, capsys):
  output, work = tmp_path / "cache_read.json", tmp_path / "work"
  work.mkdir()
  result = bench.main(["--gib=0.002", "--shard_mb=1", "--length=64", "--batch=8", "--batches=4", "--threads=1",
                       f"--workdir={work}", f"--output={output}"])
  last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert last == json.loads(output.read_text()) == json.loads(json.dumps(result))
  assert os.listdir(work) == []  # The synthetic cache is gone.
  assert last["shards"] >= 2 and last["rows"] >= 8 * 5
  for key in ("hash_cold_mb_s", "hash_warm_mb_s", "open_full_cold_s", "open_size_cold_s", "rows_per_sec"):
    assert last[key] > 0, key
  # XLM-R base, one full segment of 64, 15% predicted (models/flops.py's docstring, by hand):
  # 6*N*n + 12*L*a*n^2 + 6*(e^2 + e*V)*p, N = 12*(4*768*768 + 2*768*3072).
  n, p = 64, 0.15 * 64
  flops = 6 * 12 * (4 * 768 * 768 + 2 * 768 * 3072) * n + 12 * 12 * 768 * n * n + 6 * (768**2 + 768 * 250_002) * p
  assert last["flops_per_row"] == pytest.approx(flops)
  assert last["h100_rows_per_sec"] == pytest.approx(0.4 * 989e12 / flops)
  assert last["ratio"] == pytest.approx(last["rows_per_sec"] / last["h100_rows_per_sec"])

