"""The packed cache in a bucket: `xalign cache --output=gs://...` and a run from `cache:gs://...`, against a real
GCS server on 127.0.0.1 (tests/gcs.py).

The command writes the split locally, then uploads it, manifest last; a run stages the split on this host's
disk, verified against the manifest's hashes (data/packed/staging.py), trains the very losses of the same
run from a local cache of the same rows and saves the same data position; a rerun finds its staged copy and
downloads nothing; a shard edited in the bucket is refused in one line naming it.
"""

from __future__ import annotations

import json
import os
import tempfile

import pytest

from tests.hardening import harness

pytestmark = pytest.mark.contract

TASK = "tiny_mix"
ROWS = 48
STEPS = 4


@pytest.fixture(scope="module")
def caches(gcs, tiny_corpus, tmp_path_factory):
  """The same tiny_mix cache written by `xalign cache` into the bucket and into a local folder, in 3 shards."""
  from flax_xalign.training import cache_job

  del tiny_corpus  # (registers tiny_mix)
  root = tmp_path_factory.mktemp("bucket_cache")
  monkeypatch = pytest.MonkeyPatch()
  monkeypatch.setenv("FLAX_XALIGN_CACHE_STAGING", str(root / "staged"))  # Not the user's ~/.cache.
  (root / "tmp").mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(root / "tmp"))  # Where the command writes before it uploads.
  plan = cache_job.plan

  def small_shards(*args, **kwargs):  # --shard_mb=1 holds ~11,000 of these rows: 16 rows a shard instead.
    info, spec = plan(*args, **kwargs)
    return info, {**spec, "shard_bytes": 16 * 95}  # (5 uint8 features x 19 tokens a row)

  monkeypatch.setattr(cache_job, "plan", small_shards)
  url, local = "gs://bucket/bkc/cache", root / "local"
  for output in (url, local):
    code = harness.call_main("cache", [f"--task={TASK}", f"--output={output}", "--length=19",
                                       f"--examples={ROWS}"])
    assert code == 0, f"xalign cache --output={output} exited {code}"
  monkeypatch.setattr(cache_job, "plan", plan)
  yield {"root": root, "url": url, "local": str(local)}
  monkeypatch.undo()


def _gin(caches, name: str, cache: str) -> str:
  return harness.write_cache_run_gin(caches["root"] / f"{name}.gin", cache, task=TASK, checkpoint_every=2)


def _staged_shards(url: str) -> dict[str, tuple[int, int]]:
  """{shard: (inode, mtime_ns)} of the staged copy of the train split: a download replaces the file."""
  from flax_xalign.data.packed import staging

  folder = os.path.join(staging.staging_folder(url), "train")
  return {n: (os.stat(os.path.join(folder, n)).st_ino, os.stat(os.path.join(folder, n)).st_mtime_ns)
          for n in sorted(os.listdir(folder)) if n.endswith(".array_record")}


def test_xalign_cache_uploads_the_split_with_its_manifest_last(gcs, caches):
  from flax_xalign import storage

  local = os.path.join(caches["local"], "train")
  names = gcs.objects("bucket", "bkc/cache/")
  assert sorted(n.rsplit("/", 1)[1] for n in names if n.startswith("bkc/cache/train/")) == sorted(os.listdir(local))
  manifest = json.loads(gcs.read("bucket", "bkc/cache/train/manifest.json"))
  assert manifest["examples"] == ROWS and len(manifest["shards"]) == 3
  for name in ("manifest.json", *(s["file"] for s in manifest["shards"])):  # The same bytes as the local write.
    with open(os.path.join(local, name), "rb") as f:
      assert gcs.read("bucket", f"bkc/cache/train/{name}") == f.read(), name
  fs, inner = storage.filesystem(caches["url"] + "/train")
  generations = {os.path.basename(e["name"]): int(e["generation"]) for e in fs.ls(inner, detail=True, refresh=True)}
  assert generations["manifest.json"] == max(generations.values()), generations
  left = [n for n in os.listdir(caches["root"] / "tmp") if n.startswith("xalign-cache-upload-")]
  assert not left, f"the local copy of the write was left behind: {left}"


def test_a_run_from_the_bucket_trains_as_from_the_local_cache_and_a_rerun_reuses_the_staged_copy(
    gcs, caches, capfd):
  del gcs
  reference = caches["root"] / "from_local"
  out = harness.run_main(capfd, "train", harness.train_argv(_gin(caches, "local", caches["local"]), reference,
                                                            f"--gin.TRAIN_STEPS={STEPS}"))
  assert out.code == 0, out.err[-3000:]
  gin_file, model_dir = _gin(caches, "bucket", f"{caches['url']}"), caches["root"] / "from_bucket"
  first = harness.run_main(capfd, "train", harness.train_argv(gin_file, model_dir, f"--gin.TRAIN_STEPS={STEPS // 2}"))
  assert first.code == 0, first.err[-3000:]
  assert f"staging {caches['url']}/train into " in first.err, first.err[-3000:]
  staged = _staged_shards(caches["url"])
  assert len(staged) == len(json.loads(open(os.path.join(caches["local"], "train", "manifest.json")).read())["shards"])
  second = harness.run_main(capfd, "train", harness.train_argv(gin_file, model_dir, f"--gin.TRAIN_STEPS={STEPS}"))
  assert second.code == 0, second.err[-3000:]
  assert "resum" in (second.out + second.err).lower(), second.out[-2000:]
  assert "staged copy" in second.err and "staging gs://" not in second.err, second.err[-3000:]
  assert _staged_shards(caches["url"]) == staged, "the rerun downloaded the shards again"
  expected = harness.metrics_losses(reference)
  assert sorted(expected) == list(range(1, STEPS + 1))
  assert harness.metrics_losses(model_dir) == expected
  for step in (STEPS // 2, STEPS):  # The saved data position does not depend on where the rows were read.
    position = f"checkpoints/{step}/data_iterator_cache/process_0.json"
    with open(reference / position) as a, open(model_dir / position) as b:
      assert json.load(a) == json.load(b), position


def test_a_shard_edited_in_the_bucket_is_refused_in_one_line(gcs, caches, capfd):
  from flax_xalign import storage

  for name in gcs.objects("bucket", "bkc/cache/train/"):  # A copy of the cache, one byte of one shard changed.
    data = bytearray(gcs.read("bucket", name))
    if name.endswith("shard-00001.array_record"):
      data[len(data) // 2] ^= 0xFF
    storage.write_object(f"gs://bucket/{name.replace('bkc/cache/', 'bkc/tampered/')}", bytes(data))
  model_dir = caches["root"] / "tampered_run"
  out = harness.run_main(capfd, "train", harness.train_argv(_gin(caches, "tampered", "gs://bucket/bkc/tampered"),
                                                            model_dir, f"--gin.TRAIN_STEPS={STEPS}"))
  harness.assert_user_error(out, "gs://bucket/bkc/tampered/train/shard-00001.array_record", "sha256",
                            model_dir=model_dir, before=None)


def test_the_bucket_output_is_checked_before_any_work_and_replaced_only_with_overwrite(gcs, caches, capfd):
  from flax_xalign import storage
  from flax_xalign.data.packed import format as format_lib
  from flax_xalign.data.packed import upload

  again = harness.run_main(capfd, "cache", [f"--task={TASK}", f"--output={caches['url']}", "--length=19"])
  harness.assert_user_error(again, "already exists", "--overwrite")
  missing = harness.run_main(capfd, "cache", [f"--task={TASK}", "--output=gs://no-such-bucket/cache"])
  harness.assert_user_error(missing, "gs://no-such-bucket", "does not exist")
  url = "gs://bucket/bkc/replaced"
  upload.upload_split(os.path.join(caches["local"], "train"), url, "train", overwrite=False)
  storage.write_object(f"{url}/train/shard-09999.array_record", b"")  # Not the writer's: --overwrite keeps off.
  with pytest.raises(Exception, match="shard-09999.array_record, which xalign cache did not write"):
    upload.upload_split(os.path.join(caches["local"], "train"), url, "train", overwrite=True)
  storage.remove(f"{url}/train/shard-09999.array_record")
  storage.remove(f"{url}/train/manifest.json")  # As an upload cut short leaves it: shards, no manifest.
  assert not format_lib.has_split(url, "train")
  with pytest.raises(Exception, match="did not finish"):
    upload.check_output(url, "train", overwrite=False)
  upload.upload_split(os.path.join(caches["local"], "train"), url, "train", overwrite=True)
  assert gcs.objects("bucket", "bkc/replaced/train/") == [n.replace("bkc/cache/", "bkc/replaced/")
                                                          for n in gcs.objects("bucket", "bkc/cache/train/")]
  assert format_lib.open_split(url, "train").manifest.examples == ROWS


def test_the_staging_bench_measures_cold_and_warm_and_ends_with_the_json(gcs, tmp_path, capsys):
  from tests import testlib

  bench = testlib.load_bench("cache_staging.py")
  output = tmp_path / "cache_staging.json"
  result = bench.main(["--gib=0.002", "--shard_mb=1", "--length=64", f"--emulator={gcs.url}",
                       f"--workdir={tmp_path}", f"--output={output}"])
  last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert last == json.loads(output.read_text()) == json.loads(json.dumps(result))
  assert last["shards"] >= 2 and last["bytes"] > 1 << 20
  for key in ("upload_s", "cold_s", "warm_s", "warm_full_s", "ceiling_s"):
    assert last[key] > 0, key
  assert sorted(os.listdir(tmp_path)) == ["cache_staging.json"]  # The cache and its copies are gone.
