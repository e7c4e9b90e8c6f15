"""A run that lives in a bucket: train, resume, read, against a real GCS server on 127.0.0.1 (tests/gcs.py)."""

import json

import pytest

from tests.hardening import harness

pytestmark = pytest.mark.contract


def test_tiny_train_writes_the_whole_run_into_the_bucket(gcs, tiny_corpus, tmp_path, capfd, monkeypatch):
  monkeypatch.chdir(tmp_path)
  gin_file = harness.write_run_gin(tmp_path / "run.gin", tiny_corpus, tag="gcs1")
  out = harness.run_main(capfd, "train", harness.train_argv(gin_file, "gs://bucket/run1", "--gin.TRAIN_STEPS=4"))
  assert out.code == 0, out.err[-3000:]
  names = gcs.objects("bucket", "run1/")
  assert not list(tmp_path.glob("gs*")), "a local folder named after the URL was written"
  for name in ("run1/config.gin", "run1/metrics.jsonl", "run1/.lock", "run1/checkpoints/4/commit_success.txt"):
    assert name in names, names
  rows = [json.loads(line) for line in gcs.read("bucket", "run1/metrics.jsonl").decode().splitlines()]
  assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4]


def test_a_bucket_that_does_not_exist_is_one_line_before_any_work(gcs, tiny_corpus, tmp_path, capfd, monkeypatch):
  monkeypatch.chdir(tmp_path)
  gin_file = harness.write_run_gin(tmp_path / "run.gin", tiny_corpus, tag="gcs2")
  out = harness.run_main(capfd, "train", harness.train_argv(gin_file, "gs://no-such-bucket/run", "--gin.TRAIN_STEPS=2"))
  problems = harness.user_error_problems(out, ("no-such-bucket", "does not exist"))
  assert not problems, "; ".join(problems) + " -- " + out.err[-2000:]
  assert "step 1" not in out.out and not list(tmp_path.glob("gs*"))
