"""Smoke test of bench/input_pipeline.py in-process on the tiny mixture (rates are not checked, only that both
sides deliver the loop's batches and the summary is consistent)."""

import json

import pytest

from tests import testlib


@pytest.fixture(scope="module")
def bench():
  return testlib.load_bench("input_pipeline.py")


def test_quick_run_ends_with_the_json_summary(bench, tiny_corpus, tmp_path, capsys):
  output = tmp_path / "input_pipeline.json"
  result = bench.main(["--task=tiny_mix", "--batch=6", "--length=19", "--rows=48", "--seqio_batches=3",
                       "--cache_batches=20", f"--output={output}"])
  last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert last == json.loads(output.read_text()) == json.loads(json.dumps(result))
  for side in ("seqio", "cache"):
    assert last[side]["tokens_per_sec"] > 0 and last[side]["first_batch_s"] > 0
    assert last[side]["real_tokens_per_sec"] <= last[side]["tokens_per_sec"]
  assert last["ratio"] == pytest.approx(last["cache"]["tokens_per_sec"] / last["seqio"]["tokens_per_sec"])
  assert last["cache"]["batches"] == 20  # 20 batches of 6 from 48 rows: the cache cycles epochs.
  assert 5e5 < last["h100_xlmr_base_45pct_tokens_per_sec"] < 7e5  # 45% of 989 TFLOP/s over ~740 MFLOP/token.
