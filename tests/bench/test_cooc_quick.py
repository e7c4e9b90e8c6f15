"""Smoke tests of the co-occurrence benches (cooc, cooc_lookup, gc_step) in --quick mode; no timings checked."""

import json
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def _run(script: str, *args: str) -> tuple[str, dict]:
  proc = subprocess.run([sys.executable, str(REPO / "bench" / script), "--quick", *args],
                        cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return proc.stdout, json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # tokenises the embedded Bible once (~20 s), then counts ~1M tokens.
def test_cooc_bench_counts_equal_tables_and_reports_a_ratio(tmp_path: pathlib.Path):
  output = tmp_path / "cooc.json"
  _, result = _run("cooc.py", "--output", str(output))
  assert result["counts_equal"] and result["table_bit_equal"]
  assert result["ratio"] > 0 and result["tokens_per_s"] > 0 and result["baseline_tokens_per_s"] > 0
  assert json.loads(output.read_text()) == result


@pytest.mark.slow  # two small compiles in a fresh process.
def test_cooc_lookup_bench_reports_time_per_batch(tmp_path: pathlib.Path):
  output = tmp_path / "cooc_lookup.json"
  _, result = _run("cooc_lookup.py", "--output", str(output))
  assert result["seconds_per_batch"] > 0 and result["ratio"] > 0
  assert json.loads(output.read_text()) == result


@pytest.mark.slow  # three small compiles in a fresh process.
def test_gc_step_bench_reports_both_equations_against_mlm(tmp_path: pathlib.Path):
  output = tmp_path / "gc_step.json"
  _, result = _run("gc_step.py", "--output", str(output))
  assert result["ratio"] == pytest.approx(result["gc_ms"] / result["mlm_ms"])
  assert result["ratio_output"] == pytest.approx(result["gc_output_ms"] / result["mlm_ms"])
  assert json.loads(output.read_text()) == result
