"""s3:// through the same storage layer, against a real S3 server on 127.0.0.1 (moto's, tests/s3.py).

What S3 holds: packed caches (written by `xalign cache`, staged and verified by a run as from gs://), inputs
and outputs of the readers. What it cannot hold: a run. Orbax's TensorStore layer writes checkpoints only to
local folders and gs://, so an s3:// MODEL_DIR is refused in one line before any work, by train and readers.
"""

from __future__ import annotations

import tempfile

import pytest

from tests.hardening import harness

pytestmark = pytest.mark.contract

TASK = "tiny_mix"
STEPS = 2
PAIRS = "das haus sieht den hund\tthe house sees the dog\nder fluss läuft\tthe river runs\n"


@pytest.fixture(scope="module")
def trained(s3, tiny_corpus, tmp_path_factory):
  """The same tiny_mix cache written by `xalign cache` to s3:// and to a local folder; a run trained from each."""
  del s3, tiny_corpus  # (the server; tiny_mix registered)
  root = tmp_path_factory.mktemp("s3")
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv("FLAX_XALIGN_CACHE_STAGING", str(root / "staged"))
    (root / "tmp").mkdir()
    patch.setattr(tempfile, "tempdir", str(root / "tmp"))
    runs = {}
    for where, cache in (("local", str(root / "cache")), ("s3", "s3://bucket/s3c/cache")):
      code = harness.call_main("cache", [f"--task={TASK}", f"--output={cache}", "--length=19", "--examples=32"])
      assert code == 0, f"xalign cache --output={cache} exited {code}"
      gin_file = harness.write_cache_run_gin(root / f"{where}.gin", cache, task=TASK, checkpoint_every=STEPS)
      runs[where] = root / f"run_{where}"
      code = harness.call_main("train", harness.train_argv(gin_file, runs[where], f"--gin.TRAIN_STEPS={STEPS}"))
      assert code == 0, f"training from {cache} exited {code}"
    yield {"root": root, "runs": runs}


def test_a_run_trains_from_a_cache_on_s3_as_from_the_same_cache_on_disk(trained):
  local, from_s3 = (harness.metrics_losses(trained["runs"][w]) for w in ("local", "s3"))
  assert sorted(local) == list(range(1, STEPS + 1)) and from_s3 == local
  staged = list((trained["root"] / "staged").rglob("*.array_record"))
  assert staged, "the s3 cache was not staged on this host's disk"


def test_align_reads_its_input_from_s3_and_writes_its_links_there(trained, capfd):
  import fsspec

  fs = fsspec.filesystem("s3")
  fs.pipe_file("bucket/s3in/pairs.tsv", PAIRS.encode())
  (trained["root"] / "pairs.tsv").write_text(PAIRS, encoding="utf-8")
  flags = ["--layer=2", "--method=argmax", "--batch_size=4", f"--model_dir={trained['runs']['s3']}"]
  local = trained["root"] / "links.txt"
  assert harness.run_main(capfd, "align", [*flags, f"--input={trained['root'] / 'pairs.tsv'}",
                                           f"--output={local}"]).code == 0
  out = harness.run_main(capfd, "align", [*flags, "--input=s3://bucket/s3in/pairs.tsv",
                                          "--output=s3://bucket/s3out/links.txt"])
  assert out.code == 0, out.err[-3000:]
  assert fs.cat_file("bucket/s3out/links.txt") == local.read_bytes() and local.read_text().strip()


@pytest.mark.parametrize("entry,flags", [
    ("train", None),
    ("align", ["--model_dir=s3://bucket/run_s3", "--input=PAIRS", "--output=links.txt"]),
])
def test_an_s3_model_dir_is_one_line_naming_where_a_run_can_live(s3, tiny_corpus, tmp_path, capfd, entry, flags):
  del s3
  (tmp_path / "pairs.tsv").write_text(PAIRS, encoding="utf-8")
  flags = [f.replace("PAIRS", str(tmp_path / "pairs.tsv")).replace("links.txt", str(tmp_path / "links.txt"))
           for f in flags or []] or None
  if flags is None:
    gin_file = harness.write_run_gin(tmp_path / "run.gin", tiny_corpus, tag="s3r")
    flags = harness.train_argv(gin_file, "s3://bucket/run_s3", "--gin.TRAIN_STEPS=2")
  out = harness.run_main(capfd, entry, flags)
  problems = harness.user_error_problems(out, ("s3://bucket/run_s3", "gs:// or a local folder"))
  assert not problems, "; ".join(problems) + " -- " + out.err[-2000:]
  assert "step 1" not in out.out
