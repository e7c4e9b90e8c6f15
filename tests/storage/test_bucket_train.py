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


def test_text_and_tsv_tasks_and_their_vocabulary_read_from_the_bucket(gcs, tiny_corpus, tmp_path, capfd, monkeypatch):
  from flax_xalign import storage

  monkeypatch.chdir(tmp_path)
  files = tiny_corpus["files"]

  def upload(path):
    url = f"gs://bucket/corpus/{path.rsplit('/', 1)[1]}"
    with open(path, "rb") as f:
      storage.write_object(url, f.read())
    return url

  en = {s: upload(files[("en", s)]) for s in ("train", "validation")}
  tsv = {s: upload(files[("de_en", s)]) for s in ("train", "validation")}
  vocab = upload(tiny_corpus["vocab"])
  results = {}
  for where, kwargs in (("local", {}), ("bucket", {"en": en, "tsv": tsv, "vocab": vocab})):
    gin_file = harness.write_run_gin(tmp_path / f"{where}.gin", tiny_corpus, tag=f"gcs3{where[0]}", **kwargs)
    out = harness.run_main(capfd, "train", harness.train_argv(gin_file, f"gs://bucket/tasks_{where}",
                                                              "--gin.TRAIN_STEPS=2"))
    assert out.code == 0, out.err[-3000:]
    results[where] = [json.loads(line)["loss"] for line in
                      gcs.read("bucket", f"tasks_{where}/metrics.jsonl").decode().splitlines()
                      if "loss" in json.loads(line)]
  assert results["bucket"] == results["local"] and len(results["local"]) == 2, results
